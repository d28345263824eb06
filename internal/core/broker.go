package core

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/logbus/logbus/internal/kit"
)

// Broker is the registry of topics and groups, and owns their lifecycle.
// All its methods are safe for concurrent use.
type Broker struct {
	clock        Clock        // stamps records and dates dead letters
	defaultClock *coarseClock // the clock when Config had none; Close stops it
	// ageClock tells the partitions' MaxAge how old a record is: the clock
	// Config gave, or else time.Now itself, so that a producer waiting for
	// a record to expire wakes when it does, not a ClockResolution later.
	ageClock Clock
	ids      IDSource // nil: records are named by position
	retry    RetryPolicy

	idPrefix string       // the default IDs' per-broker prefix
	topicSeq atomic.Int64 // numbers topics for the default IDs
	offsets  *OffsetStore
	stuck    *kit.Watchdog[stuckKey] // nil unless Config.StuckAfter is set (stuck.go)
	obs      Observer                // nil when nothing observes; see observe.go

	// handlerCtx is every handler's context. It ends only when Close gives up
	// on draining, to hurry the handlers still running.
	handlerCtx    context.Context
	stopHandlers  context.CancelFunc
	state         atomic.Int32
	progressWatch atomic.Int32 // Drain calls waiting; see notifyProgress

	closer kit.Closer // runs Close once

	mu      sync.Mutex // guards the registries
	topics  map[string]*Topic
	groups  map[groupKey]*Group
	retired map[*Group]struct{} // deleted groups whose workers may still run: Close waits for them; see lifecycle.go

	progressMu sync.Mutex
	progress   chan struct{} // closed and replaced when a group may have caught up
}

type groupKey struct{ topic, group string }

// NewBroker returns a running broker.
func NewBroker(cfg Config) (*Broker, error) {
	retry, err := cfg.Retry.Resolve()
	if err != nil {
		return nil, err
	}
	if cfg.StuckAfter < 0 {
		return nil, fmt.Errorf("%w: stuck threshold %v is negative", ErrInvalid, cfg.StuckAfter)
	}
	var defaultClock *coarseClock
	ageClock := cfg.Clock
	if cfg.Clock == nil {
		defaultClock = newCoarseClock()
		cfg.Clock, ageClock = defaultClock, systemClock{}
	}
	b := &Broker{
		clock:        cfg.Clock,
		defaultClock: defaultClock,
		ageClock:     ageClock,
		ids:          cfg.IDs,
		idPrefix:     newBrokerIDPrefix(),
		retry:        retry,
		offsets:      NewOffsetStore(),
		topics:       make(map[string]*Topic),
		groups:       make(map[groupKey]*Group),
		progress:     make(chan struct{}),
		obs:          cfg.Observer,
	}
	b.handlerCtx, b.stopHandlers = context.WithCancel(context.Background())
	if cfg.StuckAfter > 0 {
		// It samples the workers' progress until Close halts it, after
		// the workers exited.
		b.stuck = kit.StartWatchdog(cfg.StuckAfter, stuckProbe{b}, b.obs)
	}
	return b, nil
}

// State returns the broker's lifecycle stage.
func (b *Broker) State() State { return State(b.state.Load()) }

// CreateTopic registers a new topic.
func (b *Broker) CreateTopic(name string, cfg TopicSpec) (*Topic, error) {
	// Refuse a taken name before building the topic, which can allocate a
	// lot (see MaxTopicMessages), and again after: another call may have
	// taken it meanwhile.
	if err := b.creatable(name); err != nil {
		return nil, err
	}
	t, err := newTopic(b, name, cfg)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.creatableLocked(name); err != nil {
		return nil, err
	}
	b.topics[name] = t
	return t, nil
}

func (b *Broker) creatable(name string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.creatableLocked(name)
}

func (b *Broker) creatableLocked(name string) error {
	if b.State() != Running {
		return ErrClosed
	}
	if _, ok := b.topics[name]; ok {
		return ErrTopicExists
	}
	return nil
}

// Topic returns the topic called name.
func (b *Broker) Topic(name string) (*Topic, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	t, ok := b.topics[name]
	if !ok {
		return nil, ErrTopicNotFound
	}
	return t, nil
}

// Subscribe adds consumer to group on topic, creating the group (with cfg)
// on first use, and rebalances. Joining an existing group with a cfg that
// resolves (GroupSpec.Resolve) other than the group's is ErrSubscription. onLeave, when not nil, is called once
// the consumer has left and its workers have stopped, by Leave or by Close.
// Every argument is checked before anything changes. It does not block.
func (b *Broker) Subscribe(topic, group, consumer string, h Handler, onLeave func(), cfg GroupSpec) (*Group, error) {
	if h == nil {
		return nil, fmt.Errorf("%w: nil handler", ErrSubscription)
	}
	return b.subscribe(topic, group, consumer, handlers{one: h}, onLeave, cfg)
}

// SubscribeBatch is Subscribe for a consumer that takes its records in
// batches, as spec says (see engine.BatchHandler).
func (b *Broker) SubscribeBatch(topic, group, consumer string, h BatchHandler, onLeave func(), cfg GroupSpec, spec BatchSpec) (*Group, error) {
	if h == nil {
		return nil, fmt.Errorf("%w: nil handler", ErrSubscription)
	}
	spec, err := spec.Resolve()
	if err != nil {
		return nil, err
	}
	if cfg.KeyConcurrency > 1 {
		// A batch is already a unit of concurrency: its records are
		// handled together and committed together.
		return nil, fmt.Errorf("%w: a batch consumer cannot have key concurrency (%d)", ErrInvalid, cfg.KeyConcurrency)
	}
	return b.subscribe(topic, group, consumer, handlers{batch: h, spec: spec}, onLeave, cfg)
}

// subscribe checks the names and the spec, joins, and raises the
// rebalance outside b.mu (an observer may read the broker).
func (b *Broker) subscribe(topic, group, consumer string, h handlers, onLeave func(), cfg GroupSpec) (*Group, error) {
	switch {
	case group == "":
		return nil, fmt.Errorf("%w: empty group name", ErrSubscription)
	case consumer == "":
		return nil, fmt.Errorf("%w: empty consumer name", ErrSubscription)
	}
	t, err := b.Topic(topic)
	if err != nil {
		return nil, err
	}
	spec, err := cfg.Resolve(b.retry)
	if err != nil {
		return nil, err
	}
	g, e, err := b.join(t, group, consumer, h, onLeave, spec)
	if err != nil {
		return nil, err
	}
	g.observe(e)
	return g, nil
}

// join is subscribe under b.mu, with spec resolved; it returns the
// rebalance event to raise once b.mu is released.
func (b *Broker) join(t *Topic, group, consumer string, h handlers, onLeave func(), spec GroupSpec) (*Group, *Event, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.State() != Running {
		return nil, nil, ErrClosed
	}
	key := groupKey{t.name, group}
	g, ok := b.groups[key]
	if !ok {
		// A new group takes its first consumer before it is registered, and
		// under b.mu, so Close cannot begin in between: a Subscribe that
		// fails leaves no group behind.
		g = newGroup(b, t, group, spec)
	}
	e, err := g.join(consumer, h, onLeave, spec)
	if err != nil {
		return nil, nil, err
	}
	b.groups[key] = g
	return g, e, nil
}

// Group returns the group called name on topic.
func (b *Broker) Group(name, topic string) (*Group, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.topics[topic]; !ok {
		return nil, ErrTopicNotFound
	}
	g, ok := b.groups[groupKey{topic, name}]
	if !ok {
		return nil, fmt.Errorf("%w: no such group", ErrSubscription)
	}
	return g, nil
}

// Drain blocks until every group has committed every record published so
// far, and returns nil. A group with lag that cannot make progress (paused,
// or without consumers) makes it return at once an error wrapping
// ErrStalled that names the group; when ctx ends first, it returns an error
// wrapping ctx's that names what was left. After Close, a group left with
// lag can never move again: Drain then returns an error wrapping ErrClosed
// that names it. Drain is woken by commits and by every change that can
// stall a group; it does not poll.
func (b *Broker) Drain(ctx context.Context) error {
	_, err := b.drain(ctx, false)
	return err
}

// drain is Drain; with skipStalled it waits only for the groups that can
// make progress, as Close does. It also returns the groups with lag that
// could not move when it last looked (described as behind does), which is
// why Close leaves their records behind.
func (b *Broker) drain(ctx context.Context, skipStalled bool) (stalled []string, err error) {
	for {
		b.progressWatch.Add(1)
		b.progressMu.Lock()
		changed := b.progress
		b.progressMu.Unlock()
		behind, stalled, stopped := b.behind()
		if len(stalled) > 0 && !skipStalled {
			b.progressWatch.Add(-1)
			if stopped {
				return stalled, fmt.Errorf("%w: %s", ErrClosed, strings.Join(stalled, "; "))
			}
			return stalled, fmt.Errorf("%w: %s", ErrStalled, strings.Join(stalled, "; "))
		}
		if len(behind) == 0 {
			b.progressWatch.Add(-1)
			return stalled, nil
		}
		select {
		case <-changed:
			b.progressWatch.Add(-1)
		case <-ctx.Done():
			b.progressWatch.Add(-1)
			behind, stalled, _ := b.behind()
			if len(behind) > 0 {
				return stalled, fmt.Errorf("%w; left: %s", ctx.Err(), strings.Join(behind, "; "))
			}
			return stalled, nil
		}
	}
}

// behind describes the groups that have lag: those that can make progress,
// and those that cannot (stalled). stopped says that one of the stalled
// cannot because Close stopped it.
func (b *Broker) behind() (behind, stalled []string, stopped bool) {
	for _, g := range b.groupList() {
		lag := g.Lag()
		redriving := g.redriving()
		if lag == 0 && redriving == 0 {
			continue
		}
		desc := fmt.Sprintf("group %q on topic %q lags %d", g.name, g.topic.name, lag)
		if redriving > 0 {
			desc += fmt.Sprintf(" with %d redriven dead letters to deliver", redriving)
		}
		switch why := g.stalled(); why {
		case "":
			behind = append(behind, desc)
		case isStopped:
			stopped = true
			fallthrough
		default:
			stalled = append(stalled, desc+" and "+why)
		}
	}
	slices.Sort(behind)
	slices.Sort(stalled)
	return behind, stalled, stopped
}

// notifyProgress wakes Drain. Callers: a commit that reached the end of its
// partition, and every change that can make a group inactive or move its
// cursor. One atomic load when nobody drains. As with Partition.notifyCommit,
// Drain registers before it reads the cursors and committers write their
// cursor before they look, so no wake-up is lost.
func (b *Broker) notifyProgress() {
	if b.progressWatch.Load() == 0 {
		return
	}
	b.progressMu.Lock()
	close(b.progress)
	b.progress = make(chan struct{})
	b.progressMu.Unlock()
}

func (b *Broker) groupList() []*Group {
	b.mu.Lock()
	defer b.mu.Unlock()
	groups := make([]*Group, 0, len(b.groups))
	for _, g := range b.groups {
		groups = append(groups, g)
	}
	return groups
}

// Close shuts the broker down gracefully:
//
//  1. it refuses new publishes, topics and subscriptions (ErrClosed), and
//     producers blocked on a full partition fail with ErrClosed;
//  2. it drains the groups that can make progress, bounded by ctx;
//  3. it stops every worker and waits for it, bounded by ctx (see
//     kit.AwaitWorkers: when ctx ends first, it cancels the handlers'
//     context and waits kit.CloseGrace more);
//  4. it seals every cursor, so a handler still running commits nothing
//     after Close returns, and tells every consumer it left (a Stream's
//     channel closes once its workers exited);
//  5. the state becomes Stopped.
//
// It returns nil when every group committed everything, and a
// *ShutdownError listing each (group, topic, partition) left behind
// otherwise, which wraps ctx's error when ctx ended first, or else an error
// wrapping ErrStalled naming the groups that could not move. Close runs
// once (kit.Closer): later and concurrent calls wait for the first, bounded
// by their own ctx, and return its result.
func (b *Broker) Close(ctx context.Context) error {
	return b.closer.Close(ctx, func() error { return b.close(ctx) })
}

// close is Close's sequence, run once.
func (b *Broker) close(ctx context.Context) error {
	b.mu.Lock()
	b.state.Store(int32(Draining))
	topics := make([]*Topic, 0, len(b.topics))
	for _, t := range b.topics {
		topics = append(topics, t)
	}
	b.mu.Unlock()

	for _, t := range topics {
		for _, p := range t.parts {
			p.seal(ErrClosed)
		}
	}
	stalled, _ := b.drain(ctx, true)
	groups := b.groupList()
	// Deleted groups have nothing left to drain or report, but a worker of
	// theirs may still run: Close stops it as well.
	stopping := append(b.retiredList(), groups...)
	for _, g := range stopping {
		g.shutdown()
	}
	_ = kit.AwaitWorkers(ctx, func(ctx context.Context) error {
		for _, g := range stopping {
			if err := g.waitStopped(ctx); err != nil {
				return err
			}
		}
		return nil
	}, b.stopHandlers)
	b.stopHandlers()

	var pending []Unfinished
	for _, g := range groups {
		g.reparkRedriven()
		pending = append(pending, g.unfinished()...)
	}
	slices.SortFunc(pending, func(x, y Unfinished) int {
		return cmp.Or(cmp.Compare(x.Group, y.Group), cmp.Compare(x.Topic, y.Topic), cmp.Compare(x.Partition, y.Partition))
	})
	var err error
	if len(pending) > 0 {
		// Err always wraps a sentinel: records are left behind only when
		// ctx ended, or when a group could not move. The drain's last look
		// names those: a group may stall during the drain (its last
		// consumer left mid-Close), so a look before it could miss one.
		e := &ShutdownError{Unfinished: pending}
		switch {
		case ctx.Err() != nil:
			e.Err = ctx.Err()
		case len(stalled) > 0:
			e.Err = fmt.Errorf("%w: %s", ErrStalled, strings.Join(stalled, "; "))
		default: // cannot be: nothing moves a drained group's offsets back once Close began
			e.Err = fmt.Errorf("%w: %s", ErrStalled, describeUnfinished(pending))
		}
		err = e
	}
	if b.defaultClock != nil {
		b.defaultClock.stop() // after the workers: a dead letter is dated by it
	}
	if b.stuck != nil {
		b.stuck.Halt()
	}
	b.state.Store(int32(Stopped))
	b.notifyProgress()
	return err
}

// describeUnfinished names the groups of pending, for an error.
func describeUnfinished(pending []Unfinished) string {
	var b strings.Builder
	for i, u := range pending {
		if i > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "group %q on topic %q partition %d did not finish", u.Group, u.Topic, u.Partition)
	}
	return b.String()
}
