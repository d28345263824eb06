package jetstream

import (
	"testing"

	"github.com/logbus/logbus/engine"
	"github.com/logbus/logbus/pubsub/pubsubtest/conformance"
)

// TestConformance runs logbus's conformance suite on this engine, in real
// time (the nats.go client cannot run in synctest bubbles), with the
// capabilities the engine declares (eng.Capabilities). It keeps two that
// the suite cannot check on it, declared here with the reason.
func TestConformance(t *testing.T) {
	conformance.RunConformance(t, conformance.Engine{
		Name:      "jetstream",
		NewBroker: newBroker,
		Untestable: map[engine.Capabilities]string{
			engine.MaxAge: "the server trims by its own clock, in real time; the suite checks MaxAge " +
				"with an injected clock or in virtual time, and counts Expired, which the server does not report",
			engine.MaxBytes: "the server counts a record's subject and headers too, so a partition " +
				"holds fewer bytes than the suite's exact counts expect",
		},
	})
}
