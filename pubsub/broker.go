package pubsub

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/engine"
)

// Broker owns topics, consumer groups and the goroutines that deliver to
// them. Create one with [NewBroker] (tests and libraries should own theirs)
// or use the process-wide [Default]. It must be closed with [Broker.Close]
// to stop its goroutines. All methods are safe for concurrent use.
type Broker struct {
	eng  engine.Engine
	caps engine.Capabilities // the engine's, read once
	err  error               // an invalid BrokerOption, reported by NewTopic
	obs  *observer           // nil when nothing observes the broker: no hook, logger or stuck watch
	reg  registry            // the topics and groups made through it, for a Partial Snapshot

	// closing is set when the first Close begins: that call logs and
	// raises [HookClose], and from then on every publish fails with
	// [ErrClosed]. stopping is closed right after, to wake PublishAsync
	// calls waiting for the in-flight bound.
	closing  atomic.Bool
	stopping chan struct{}
	inFlight inFlight // the topics whose engine confirms PublishAsync's records later
	closeMu  sync.Mutex
	closeErr [2]error // the engine's Close error and what Close made of it, so every Close returns the same value
}

// BrokerOption configures a [Broker]. Options only record; [NewBroker]
// checks them all at once.
type BrokerOption interface{ applyBroker(*brokerConfig) }

type brokerConfig struct {
	engine.Config
	engine Engine
	hooks  []Hook
	logger *slog.Logger
	err    error // the first invalid option, reported by NewBroker
}

// invalid records err unless an earlier option was invalid already.
func (c *brokerConfig) invalid(err error) {
	if c.err == nil {
		c.err = err
	}
}

type brokerOptionFunc func(*brokerConfig)

func (f brokerOptionFunc) applyBroker(c *brokerConfig) { f(c) }

// Clock reads the current time. The broker stamps records with it
// ([Message.Created]), trims by age with it ([Retention.MaxAge]) and dates
// dead letters with it ([DeadLetter.FailedAt]); [WithClock] says what the
// default is. Waiting (retry backoff, [Retention.BlockTimeout]) uses the
// runtime's timers, which testing/synctest makes virtual. Now is called from
// many goroutines at once.
type Clock interface{ Now() time.Time }

// WithClock sets the clock, overriding the default.
// [github.com/logbus/logbus/pubsub/pubsubtest.Clock] is one a test can move
// by hand. A nil Clock is [ErrInvalid].
//
// The default is time.Now read once per millisecond rather than once per
// record (reading the clock can cost as much as the rest of a publish): a
// record's Created is never later than its publish and at most about a
// millisecond earlier (more when every CPU is busy), like a Kafka
// timestamp, and records published within a millisecond may share it. A
// goroutine refreshes that reading while records are published and exits
// when they stop, so an idle broker runs no timer. [Retention.MaxAge]
// measures a record's age against time.Now itself. Give WithClock a Clock
// that calls time.Now for timestamps exact to the nanosecond.
func WithClock(c Clock) BrokerOption {
	return brokerOptionFunc(func(cfg *brokerConfig) {
		if c == nil {
			cfg.invalid(fmt.Errorf("%w: WithClock(nil)", ErrInvalid))
		}
		cfg.Clock = c
	})
}

// IDSource hands out [Message] IDs ([WithIDs]). NextID is called once per
// publish, from many goroutines at once, and must never return the same
// value twice.
type IDSource interface{ NextID() string }

// WithIDs sets the source of [Message.ID], overriding the default, which
// names a record by its position: a random per-broker prefix, the topic's
// creation number in the broker, the partition and the offset
// ("3f9a0c1d2e4b-1-0-17"). Default IDs are unique in the process and cost
// the producer nothing; an [IDSource] is called on every publish. A nil
// IDSource is [ErrInvalid].
func WithIDs(ids IDSource) BrokerOption {
	return brokerOptionFunc(func(cfg *brokerConfig) {
		if ids == nil {
			cfg.invalid(fmt.Errorf("%w: WithIDs(nil)", ErrInvalid))
		}
		cfg.IDs = ids
	})
}

// RetryPolicy says how often a failing delivery is retried and how long the
// partition's worker waits in between. Zero fields mean the defaults. The
// wait after failed attempt n is min(MaxDelay, BaseDelay·Multiplier^(n−1)),
// with no jitter. While a record waits, the records behind it in its
// partition wait too: retries never reorder a partition. After MaxAttempts,
// or at once for an error wrapping [ErrPermanent], the record becomes a
// [DeadLetter].
type RetryPolicy struct {
	// MaxAttempts is how many deliveries a record gets, the first included,
	// before it is dead-lettered. Default 3; 1 means no retries; negative is
	// [ErrInvalid]. A delivery that a closing [Stream] gave back unsettled is
	// numbered like an attempt ([Message.Attempt] counts on) but failed
	// nothing, so the record may be delivered again even past MaxAttempts.
	MaxAttempts int
	// BaseDelay is the wait after the first failure. Default 10ms.
	BaseDelay time.Duration
	// Multiplier is the growth of the wait per further failure. Default 2;
	// below 1 is [ErrInvalid].
	Multiplier float64
	// MaxDelay caps any one wait. Default 1s.
	MaxDelay time.Duration
}

func (p RetryPolicy) engine() engine.RetryPolicy { return engine.RetryPolicy(p) }

// WithRetry sets the retry policy of every group, overriding the defaults
// that [RetryPolicy] gives field by field. A group can override it with
// [WithGroupRetry].
func WithRetry(p RetryPolicy) BrokerOption {
	return brokerOptionFunc(func(cfg *brokerConfig) { cfg.Retry = p.engine() })
}

// NewBroker returns a running broker. An invalid option (a negative retry
// count, a nil option, say) does not panic: [Broker.Err] reports it, and so
// does every [NewTopic] call, wrapping [ErrInvalid].
func NewBroker(opts ...BrokerOption) *Broker {
	var cfg brokerConfig
	for i, o := range opts {
		if o == nil {
			cfg.invalid(fmt.Errorf("%w: option %d is nil", ErrInvalid, i))
			continue
		}
		o.applyBroker(&cfg)
	}
	var (
		obs *observer
		err = cfg.err
		eng engine.Engine
	)
	if err == nil {
		obs, err = newObserver(cfg.hooks, cfg.logger, cfg.StuckAfter)
	}
	if err == nil {
		cfg.Observer = obs.engineObserver()
		eng, err = cfg.open()
	}
	if err != nil {
		// A broker all the same, so that its methods work; [NewTopic]
		// reports err.
		if eng == nil {
			eng, _ = InMemory().Open(engine.Config{})
		}
		obs, err = nil, fail(err, "new broker")
	}
	b := &Broker{eng: eng, caps: eng.Capabilities(), err: err, obs: obs, stopping: make(chan struct{})}
	if obs != nil {
		for _, h := range obs.newBroker {
			obs.safely(h, "new broker", func() { h.OnNewBroker(b) })
		}
	}
	return b
}

// Err returns the error of an invalid option given to [NewBroker], or nil.
func (b *Broker) Err() error { return b.err }

var defaultBroker = sync.OnceValue(func() *Broker { return NewBroker() })

// Default returns the process-wide broker, creating it on first use. It is
// offered, not imposed: tests and libraries should use [NewBroker] so that
// each owns, and closes, its own. In particular, a test must not use
// Default inside a testing/synctest bubble: the broker would belong to that
// bubble, and touching it from outside later crashes the test binary. Safe
// for concurrent use.
func Default() *Broker { return defaultBroker() }

// State is a broker's lifecycle stage ([Broker.State]).
type State int

const (
	// Running: accepting publishes and subscriptions.
	Running State = iota
	// Draining: [Broker.Close] has begun; new work fails with [ErrClosed]
	// while the workers finish what was published.
	Draining
	// Stopped: Close has finished and every worker has exited.
	Stopped
)

func (s State) String() string { return engine.State(s).String() }

// State returns the broker's lifecycle stage. It panics with a message
// that says so on a Broker that [NewBroker] did not make.
func (b *Broker) State() State {
	if b.eng == nil {
		panic(errNoBroker)
	}
	s := State(b.eng.State())
	if s == Running && b.closing.Load() { // Close waits for PublishAsync's records before the engine's Close
		s = Draining
	}
	return s
}

// check reports a nil context or a Broker that [NewBroker] did not make.
func (b *Broker) check(ctx context.Context) error {
	switch {
	case b == nil || b.eng == nil:
		return errNoBroker
	case ctx == nil:
		return errNilContext
	}
	return nil
}

// Drain blocks until every group has committed every record published
// before the call, and returns nil. It is the barrier tests wait on instead
// of sleeping: it is woken by commits and never polls. It first waits for
// the records [Topic.PublishAsync] returned before the call to resolve,
// then for the groups; records published while it waits may or may not be
// waited for.
//
// Drain never returns nil while a group has lag. A group with lag that
// cannot make progress (paused, or whose consumers have all left) makes it
// return at once an error wrapping [ErrStalled] that names the group; when
// ctx ends first, it returns an error wrapping ctx's that names the groups
// left behind. After [Broker.Close] it returns an error wrapping
// [ErrClosed] that names the groups Close left records to (nil when it
// left none).
func (b *Broker) Drain(ctx context.Context) error {
	if err := b.check(ctx); err != nil {
		return fail(err, "drain")
	}
	if err := b.inFlight.wait(ctx); err != nil {
		return fail(err, "drain")
	}
	return fail(b.eng.Drain(ctx), "drain")
}

// Close shuts the broker down gracefully: it refuses new publishes, topics
// and subscriptions with [ErrClosed], and fails with it the producers
// blocked on a full partition or at a topic's [WithMaxInFlight] bound;
// waits, bounded by ctx, for the records [Topic.PublishAsync] has in flight
// to be stored or to fail on their own account (when ctx ends first, the
// engine fails those left with ErrClosed); drains the groups that can make
// progress, bounded by ctx; stops every worker and waits for it; closes
// every [Stream]'s channel; and sets the state to [Stopped] ([Draining]
// from its start).
//
// Close returns by the time ctx ends, plus at most 10ms: when ctx ends it
// cancels the context handlers were given and gives them those 10ms to
// return. A handler that ignores its context still runs after Close
// returned; it finishes in the background, commits nothing (its record
// counts as not delivered), and its goroutine then exits.
//
// It returns nil when every group committed everything, and otherwise a
// [*ShutdownError] saying what was left behind and why. Records left
// behind were not committed, so nothing acked is lost; the in-memory engine
// persists nothing, so they are gone with the broker. Close is idempotent
// and safe to call from many goroutines: later calls wait for the first,
// bounded by their own ctx, and return its result. Called from a handler it
// waits for that handler: see [Handler].
func (b *Broker) Close(ctx context.Context) error {
	if err := b.check(ctx); err != nil {
		return fail(err, "close")
	}
	first := b.closing.CompareAndSwap(false, true)
	var began time.Time
	if first {
		close(b.stopping)
		if b.obs != nil {
			began = time.Now()
			b.obs.logAttrs(ctx, slog.LevelInfo, "logbus: closing")
		}
	}
	// The records PublishAsync handed to the engine are stored, or fail on
	// their own account, before the engine refuses anything: when ctx
	// ends first, the engine's Close resolves those left.
	_ = b.inFlight.wait(ctx)
	err := b.eng.Close(ctx)
	b.closeMu.Lock()
	if err != b.closeErr[0] || b.closeErr[1] == nil {
		b.closeErr = [2]error{err, fail(err, "close")}
	}
	err = b.closeErr[1]
	b.closeMu.Unlock()
	if first && b.obs != nil {
		b.obs.onClose(time.Since(began), err)
	}
	return err
}

// Lag returns how many records of topic the group has yet to commit, over
// all partitions, as [Group.Lag]. An unknown topic is [ErrTopicNotFound],
// an unknown group [ErrSubscription]. It does not block.
func (b *Broker) Lag(group, topic string) (int64, error) {
	if err := b.check(context.Background()); err != nil {
		return 0, fail(err, "lag of group %q on topic %q", group, topic)
	}
	g, err := b.eng.Group(context.Background(), topic, group)
	if err != nil {
		return 0, fail(err, "lag of group %q on topic %q", group, topic)
	}
	return g.Lag(), nil
}

// Group returns an existing group of topic as a Group of its records'
// encoded bytes: each [DeadLetter]'s [Message.Value] is the value as it was
// published ([codec.Bytes]). It is for tools that do not know the group's
// types, such as a debug page: the same group as the *Group[V] that
// [Topic.Subscribe] returned, with the same offsets, counters and dead
// letters, so Pause, Resume, Seek and Replay through either move both.
// Leave a [Stream]'s consumer through the Stream, not through this view. An
// unknown topic is [ErrTopicNotFound], an unknown group [ErrSubscription].
// It does not block.
func (b *Broker) Group(group, topic string) (*Group[[]byte], error) {
	if err := b.check(context.Background()); err != nil {
		return nil, fail(err, "group %q on topic %q", group, topic)
	}
	g, err := b.eng.Group(context.Background(), topic, group)
	if err != nil {
		return nil, fail(err, "group %q on topic %q", group, topic)
	}
	return &Group[[]byte]{eng: g, values: codec.Bytes(), obs: b.obs, topic: topic, state: b.eng.State, caps: b.caps}, nil
}

// Replay moves the cursors of an existing group on every partition of topic
// to from, as [Group.Replay] does. An unknown topic is [ErrTopicNotFound],
// an unknown group [ErrSubscription]: to start a new group somewhere other
// than the earliest record, use [StartAt]. Once Close began it fails with
// [ErrClosed], whatever the names.
func (b *Broker) Replay(ctx context.Context, group, topic string, from Start) error {
	if err := b.check(ctx); err != nil {
		return fail(err, "replay group %q on topic %q", group, topic)
	}
	if b.eng.State() != engine.Running { // before the names: an unknown one is no more wrong than a known one now
		return fail(ErrClosed, "replay group %q on topic %q", group, topic)
	}
	g, err := b.eng.Group(ctx, topic, group)
	if err != nil {
		return fail(err, "replay group %q on topic %q", group, topic)
	}
	err = fail(g.Replay(ctx, from.spec), "replay group %q on topic %q from %v", group, topic, from)
	b.obs.operator("replayed", topic, group, err, slog.String("from", from.String()))
	return err
}

// DeleteGroup deletes the consumer group called group on topic: it stops
// the group's consumers, forgets its offsets and dead letters, and lets go
// of the partitions it held. It is the way out for a group nobody consumes
// any more, which would otherwise hold its records, and block producers on
// a [Block] partition it fills, for the broker's life. The group is
// deleted at once, and then:
//
//   - its handles ([Topic.Subscribe]'s, [Stream.Group]'s, [Broker.Group]'s)
//     fail every call with [ErrSubscription], and read as an empty group
//     (Lag 0, Committed -1, no assignment, no dead letters);
//   - its consumers stop: no delivery begins, a Stream's delivery nobody
//     has received is taken back, and each Stream's channel closes once
//     its deliveries ended ([Stream.Close] then returns nil);
//   - producers blocked on a partition the group held full wake, and
//     append or wait by the usual rules, without the group;
//   - the name is free: a Subscribe or Stream with it creates a new group,
//     which starts where its [StartAt] says, with no dead letters.
//
// It waits for the deliveries in flight (handlers running, and Stream
// deliveries a caller holds) until ctx ends; when it ends first, it returns
// an error wrapping ctx's and the group is deleted all the same: those
// deliveries finish in the background and commit nothing, and their
// partitions are let go when they end, so handlers of the deleted group
// and of a new group of the same name may run at once. Called from a
// handler of the group, it waits for that handler: see [Handler].
//
// It is logged at Info, and raises no hook ([HookRebalance] is for a group
// whose partitions are dealt out again). An unknown topic is
// [ErrTopicNotFound], an unknown group [ErrSubscription]. It fails with
// [ErrClosed] once Close began, and with [ErrInvalid] on an engine that
// cannot delete groups.
func (b *Broker) DeleteGroup(ctx context.Context, group, topic string) error {
	if err := b.check(ctx); err != nil {
		return fail(err, "delete group %q on topic %q", group, topic)
	}
	err := fail(b.deleteGroup(ctx, group, topic), "delete group %q on topic %q", group, topic)
	b.obs.operator("deleted group", topic, group, err)
	return err
}

func (b *Broker) deleteGroup(ctx context.Context, group, topic string) error {
	if b.eng.State() != engine.Running {
		return ErrClosed
	}
	d, ok := ability[engine.Deleter](b.caps, engine.Delete, b.eng)
	if !ok {
		return fmt.Errorf("%w: the engine cannot delete groups", ErrInvalid)
	}
	err := d.DeleteGroup(ctx, topic, group)
	if deleted(err) {
		b.reg.removeGroup(topic, group)
	}
	return err
}

// DeleteTopic deletes topic and its consumer groups, at once, and then:
//
//   - every call on the topic's handle that can fail, and on its groups'
//     handles, fails with [ErrTopicNotFound], also after the name is
//     created again: an old handle never reaches the new topic. Its reads
//     (Stats, Offsets) no longer change;
//   - producers blocked on a full partition of the topic fail with
//     ErrTopicNotFound;
//   - the groups stop as [Broker.DeleteGroup] says;
//   - the name is free: [NewTopic] may create it again, with options of its
//     own and nothing of the old topic's records, offsets or groups.
//
// It waits for the groups' deliveries in flight as DeleteGroup does, and
// is deleted all the same when ctx ends first, returning an error wrapping
// ctx's. It is logged at Info and raises no hook. An unknown topic is
// [ErrTopicNotFound]. It fails with [ErrClosed] once Close began, and with
// [ErrInvalid] on an engine that cannot delete topics.
func (b *Broker) DeleteTopic(ctx context.Context, topic string) error {
	if err := b.check(ctx); err != nil {
		return fail(err, "delete topic %q", topic)
	}
	err := fail(b.deleteTopic(ctx, topic), "delete topic %q", topic)
	b.obs.operator("deleted topic", topic, "", err)
	return err
}

func (b *Broker) deleteTopic(ctx context.Context, topic string) error {
	if b.eng.State() != engine.Running {
		return ErrClosed
	}
	d, ok := ability[engine.Deleter](b.caps, engine.Delete, b.eng)
	if !ok {
		return fmt.Errorf("%w: the engine cannot delete topics", ErrInvalid)
	}
	err := d.DeleteTopic(ctx, topic)
	if deleted(err) {
		b.reg.removeTopic(topic)
	}
	return err
}

// deleted reports whether a deletion that returned err took place: it
// succeeded, or only the wait for deliveries in flight ran out of time
// (see [engine.Deleter]: an engine that could not delete says
// [ErrUnavailable], or another sentinel, not ctx's error alone).
func deleted(err error) bool {
	if err == nil {
		return true
	}
	ctxErr := errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
	return ctxErr && !errors.Is(err, ErrUnavailable)
}

// Ping reports whether the broker's engine can serve calls now: nil when it
// can, an error wrapping [ErrUnavailable] when a remote engine cannot reach
// its server (a lost connection, a server without quorum). The in-memory
// engine needs nothing it could fail to reach: Ping is nil until Close
// begins. Once Close began it returns [ErrClosed] (never ErrUnavailable):
// the broker serves no new work.
//
// ctx bounds the call: a remote engine asks its server, and answers by
// the time ctx ends. The in-memory engine answers at once. Ping logs
// nothing and raises no hook, so a health check may call it as often as it
// likes.
func (b *Broker) Ping(ctx context.Context) error {
	if err := b.check(ctx); err != nil {
		return fail(err, "ping")
	}
	if b.eng.State() != engine.Running {
		return fail(ErrClosed, "ping")
	}
	p, ok := b.eng.(engine.Pinger)
	if !ok {
		return nil // an engine that is no Pinger depends on nothing it could fail to reach
	}
	return fail(p.Ping(ctx), "ping")
}
