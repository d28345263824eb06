package properties_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/logbus/logbus/pubsub/pubsubtest"
	"github.com/logbus/logbus/pubsub/pubsubtest/conformance"
	"github.com/logbus/logbus/pubsub/pubsubtest/properties"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The property suite's model predicts what only an engine with every
// capability does: any other is skipped, by name, not run and failed.
func TestRunPropertiesSkipsAnEngineWithoutEveryCapability(t *testing.T) {
	var skipped bool
	t.Run("lesser", func(t *testing.T) {
		defer func() { skipped = t.Skipped() }()
		properties.RunProperties(t, conformance.Engine{
			Name:         "memory, synctest only",
			NewBroker:    pubsubtest.NewBroker,
			Capabilities: []conformance.Capability{conformance.Synctest},
		})
	})
	if !skipped {
		t.Error("RunProperties ran on an engine that lacks capabilities; want it skipped")
	}
}
