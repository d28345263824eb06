package properties_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/logbus/logbus/engine"
	"github.com/logbus/logbus/pubsub"
	"github.com/logbus/logbus/pubsub/pubsubtest"
	"github.com/logbus/logbus/pubsub/pubsubtest/conformance"
	"github.com/logbus/logbus/pubsub/pubsubtest/properties"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The property suite's model predicts what only an engine with every
// capability does: any other is skipped, by name, not run and failed; so
// is one that declares a capability it needs untestable.
func TestRunPropertiesSkipsAnEngineWithoutEveryCapability(t *testing.T) {
	for name, e := range map[string]conformance.Engine{
		"lesser": {Name: "memory, VirtualTime only", NewBroker: func(tb testing.TB, opts ...pubsub.BrokerOption) *pubsub.Broker {
			return pubsubtest.NewBroker(tb, append(opts, pubsub.WithEngine(lesser{engine.VirtualTime}))...)
		}},
		"untestable": {Name: "memory, MaxAge untestable", NewBroker: pubsubtest.NewBroker,
			Untestable: map[engine.Capabilities]string{engine.MaxAge: "a reason"}},
	} {
		var skipped bool
		t.Run(name, func(t *testing.T) {
			defer func() { skipped = t.Skipped() }()
			properties.RunProperties(t, e)
		})
		if !skipped {
			t.Errorf("RunProperties ran on engine %q; want it skipped", e.Name)
		}
	}
}

// lesser is the in-memory engine claiming only caps.
type lesser struct{ caps engine.Capabilities }

func (l lesser) Open(cfg engine.Config) (engine.Engine, error) {
	e, err := pubsub.InMemory().Open(cfg)
	return lesserEngine{e, l.caps}, err
}

type lesserEngine struct {
	engine.Engine
	caps engine.Capabilities
}

func (l lesserEngine) Capabilities() engine.Capabilities { return l.caps }
