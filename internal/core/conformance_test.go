package core_test

import (
	"testing"

	"github.com/logbus/logbus/pubsub/pubsubtest"
	"github.com/logbus/logbus/pubsub/pubsubtest/conformance"
)

// The in-memory engine keeps every promise of the conformance suite. It runs
// here too, beside the engine, so that this package's tests (and a mutation
// run of this package) see what the suite checks through the public API:
// batches, redrive, snapshots, stuck handlers.
func TestConformance(t *testing.T) {
	conformance.RunConformance(t, conformance.Engine{Name: "memory", NewBroker: pubsubtest.NewBroker})
}
