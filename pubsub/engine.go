package pubsub

import (
	"fmt"

	"github.com/logbus/logbus/engine"
	"github.com/logbus/logbus/internal/core"
)

// An Engine stores a Broker's topics and delivers their records: the typed
// API (codecs, routing, Message, Stream) is the same over every engine. The
// in-memory log is the default ([InMemory]); the JetStream engine lives in
// a module of its own. It is [engine.Driver], the boundary an engine
// author implements; its method is for [NewBroker], not for users.
type Engine = engine.Driver

// WithEngine sets the engine, overriding InMemory. An option the engine
// cannot honour (WithClock or WithIDs on an engine that keeps its own
// time or names) makes NewTopic fail with ErrInvalid, never silently
// behave otherwise. A nil Engine is ErrInvalid.
func WithEngine(e Engine) BrokerOption {
	return brokerOptionFunc(func(c *brokerConfig) {
		if e == nil {
			c.invalid(fmt.Errorf("%w: WithEngine(nil)", ErrInvalid))
		}
		c.engine = e
	})
}

// InMemory is the default engine: the log lives in this process's memory,
// every promise of the package documentation holds exactly, and nothing
// survives the process.
func InMemory() Engine { return inMemory{} }

type inMemory struct{}

func (inMemory) Open(cfg engine.Config) (engine.Engine, error) { return core.NewEngine(cfg) }

// open starts the engine cfg names, or the default, and checks that it
// keeps the promises the options ask for.
func (c brokerConfig) open() (engine.Engine, error) {
	e := c.engine
	if e == nil {
		e = InMemory()
	}
	eng, err := e.Open(c.Config)
	if err != nil {
		return nil, err
	}
	caps := eng.Capabilities()
	switch {
	case c.Clock != nil && !caps.Has(engine.InjectedClock):
		err = fmt.Errorf("%w: WithClock: the engine keeps its own time", ErrInvalid)
	case c.IDs != nil && !caps.Has(engine.CustomIDs):
		err = fmt.Errorf("%w: WithIDs: the engine names its records itself", ErrInvalid)
	case c.StuckAfter != 0 && !caps.Has(engine.StuckDetection):
		err = fmt.Errorf("%w: WithStuckAfter: the engine cannot watch its handlers", ErrInvalid)
	case c.StuckAfter < 0:
		err = fmt.Errorf("%w: WithStuckAfter: negative threshold %v", ErrInvalid, c.StuckAfter)
	}
	return eng, err
}
