package pubsub

import (
	"fmt"

	"github.com/logbus/logbus/engine"
	"github.com/logbus/logbus/internal/core"
)

// An Engine stores a [Broker]'s topics and delivers their records: the typed
// API (codecs, routing, [Message], [Stream]) is the same over every engine.
// The in-memory log is the default ([InMemory]); the JetStream engine lives
// in a module of its own. It is [engine.Driver], the boundary an engine
// author implements; its method is for [NewBroker], not for users.
type Engine = engine.Driver

// WithEngine sets the engine, overriding [InMemory]. An option or call the
// engine cannot honour is refused with [ErrInvalid], never silently done
// otherwise: [Broker.Capabilities] lists them. A nil Engine is ErrInvalid.
func WithEngine(e Engine) BrokerOption {
	return brokerOptionFunc(func(c *brokerConfig) {
		if e == nil {
			c.invalid(fmt.Errorf("%w: WithEngine(nil)", ErrInvalid))
		}
		c.engine = e
	})
}

// InMemory is the default engine: the log lives in this process's memory,
// every promise of this package's documentation holds exactly, and nothing
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

// Capabilities returns the promises that only some engines keep and the
// broker's engine does; every engine keeps the rest of this package's
// documentation. What needs one the engine lacks is refused with
// [ErrInvalid], never silently done otherwise: [WithClock] needs
// [engine.InjectedClock], [WithIDs] [engine.CustomIDs], [WithStuckAfter]
// [engine.StuckDetection], [Topic.SubscribeBatch] [engine.Batches], a
// [Retention] with OnFull [DropOldest], MaxAge or MaxBytes
// [engine.DropsOldest], [engine.MaxAge] or [engine.MaxBytes],
// [Group.Redrive] [engine.Redrive], [Group.DiscardDeadLetters]
// [engine.DiscardDeadLetters], [Broker.DeleteGroup] and DeleteTopic
// [engine.Delete]; without [engine.Snapshots], [Broker.Snapshot] is
// Partial. The in-memory engine has them all. It does not block, and works
// after Close.
func (b *Broker) Capabilities() engine.Capabilities { return b.caps }

// ability returns x as a T, the optional interface that goes with the
// capability need, when the engine declares need and x implements T: an
// engine that declares one without the other cannot do it. ok false is
// the caller's [ErrInvalid].
func ability[T any](caps, need engine.Capabilities, x any) (t T, ok bool) {
	t, ok = x.(T)
	return t, ok && caps.Has(need)
}

// retentionNeeds is the capability each bounded retention needs, for
// [NewTopic] to refuse one the engine lacks.
func retentionNeeds(caps engine.Capabilities, r engine.Retention) error {
	switch {
	case r.OnFull == engine.DropOldest && !caps.Has(engine.DropsOldest):
		return fmt.Errorf("%w: Retention.OnFull DropOldest: the engine cannot drop the oldest records", ErrInvalid)
	case r.MaxAge > 0 && !caps.Has(engine.MaxAge):
		return fmt.Errorf("%w: Retention.MaxAge: the engine cannot trim records by age", ErrInvalid)
	case r.MaxBytes > 0 && !caps.Has(engine.MaxBytes):
		return fmt.Errorf("%w: Retention.MaxBytes: the engine cannot bound the bytes it retains", ErrInvalid)
	}
	return nil
}
