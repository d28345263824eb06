package conformance_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/logbus/logbus/pubsub/pubsubtest"
	"github.com/logbus/logbus/pubsub/pubsubtest/conformance"
)

// Every broker a case builds must be closed by the end of it: a leftover
// worker goroutine fails the package.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The in-memory engine keeps every promise of the conformance suite.
func TestConformance(t *testing.T) {
	conformance.RunConformance(t, conformance.Engine{
		Name:         "memory",
		NewBroker:    pubsubtest.NewBroker,
		Capabilities: conformance.AllCapabilities(),
	})
}

// Declaring no capability runs the rest of the suite in real time, as it
// runs for an engine that cannot live in a testing/synctest bubble: the
// in-memory engine passes it that way too.
func TestConformanceInRealTime(t *testing.T) {
	conformance.RunConformance(t, conformance.Engine{
		Name:      "memory, no capabilities declared",
		NewBroker: pubsubtest.NewBroker,
	})
}
