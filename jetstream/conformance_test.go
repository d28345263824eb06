package jetstream

import (
	"testing"

	"github.com/logbus/logbus/pubsub/pubsubtest"
)

// TestConformance runs logbus's conformance suite on this engine, in real
// time, with the capabilities it has: none of the optional ones, but
// DropOldest and MaxAge, which the server honours.
func TestConformance(t *testing.T) {
	pubsubtest.RunConformance(t, pubsubtest.Engine{
		Name:         "jetstream",
		NewBroker:    newBroker,
		Capabilities: []pubsubtest.Capability{pubsubtest.DropOldest},
	})
}
