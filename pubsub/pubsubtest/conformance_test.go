package pubsubtest_test

import (
	"testing"

	"github.com/logbus/logbus/pubsub/pubsubtest"
)

// The in-memory engine keeps every promise of the conformance suite.
func TestConformance(t *testing.T) {
	pubsubtest.RunConformance(t, pubsubtest.Engine{
		Name:         "memory",
		NewBroker:    pubsubtest.NewBroker,
		Capabilities: pubsubtest.AllCapabilities(),
	})
}

// Declaring no capability runs the rest of the suite in real time, as it
// runs for an engine that cannot live in a testing/synctest bubble: the
// in-memory engine passes it that way too.
func TestConformanceInRealTime(t *testing.T) {
	pubsubtest.RunConformance(t, pubsubtest.Engine{
		Name:      "memory, no capabilities declared",
		NewBroker: pubsubtest.NewBroker,
	})
}

// The property suite's model predicts what only an engine with every
// capability does: any other is skipped, by name, not run and failed.
func TestRunPropertiesSkipsAnEngineWithoutEveryCapability(t *testing.T) {
	var skipped bool
	t.Run("lesser", func(t *testing.T) {
		defer func() { skipped = t.Skipped() }()
		pubsubtest.RunProperties(t, pubsubtest.Engine{
			Name:         "memory, synctest only",
			NewBroker:    pubsubtest.NewBroker,
			Capabilities: []pubsubtest.Capability{pubsubtest.Synctest},
		})
	})
	if !skipped {
		t.Error("RunProperties ran on an engine that lacks capabilities; want it skipped")
	}
}
