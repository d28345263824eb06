package jetstream

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/logbus/logbus/internal/engine"
	"github.com/logbus/logbus/pubsub"
	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
)

// New returns an engine for pubsub.WithEngine on an existing JetStream
// context. Every broker opened with it shares js's connection, which it
// never closes: the caller owns the connection and closes it after the
// brokers.
func New(js natsjs.JetStream, opts ...Option) pubsub.Engine {
	return &opener{cfg: opts, js: js}
}

// Connect returns an engine for pubsub.WithEngine on an existing
// connection, as New does with jetstream.New(nc).
func Connect(nc *nats.Conn, opts ...Option) (pubsub.Engine, error) {
	js, err := natsjs.New(nc)
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	return New(js, opts...), nil
}

// opener is a pubsub.Engine: it opens one engine per broker.
type opener struct {
	cfg  []Option
	js   natsjs.JetStream           // shared, not owned; nil when dial is set
	dial func() (*nats.Conn, error) // a connection per broker, owned by it
}

// Open starts an engine. It talks to the server (to create the membership
// bucket), bounded by the request timeout.
func (o *opener) Open(ecfg engine.Config) (engine.Engine, error) {
	cfg := defaultConfig()
	for _, opt := range o.cfg {
		opt.apply(&cfg)
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	retry, err := ecfg.Retry.Resolve()
	if err != nil {
		return nil, err
	}
	e := &eng{cfg: cfg, names: names{prefix: encodeName(cfg.prefix)}, retry: retry, obs: ecfg.Observer,
		topics: map[string]*topic{}, groups: map[groupKey]*group{},
		closing: make(chan struct{}), commits: make(chan struct{})}
	e.handlerCtx, e.cancelHandlers = context.WithCancel(context.Background())
	var id [6]byte
	_, _ = rand.Read(id[:])
	e.instance = hex.EncodeToString(id[:])
	js := o.js
	if o.dial != nil {
		if e.nc, err = o.dial(); err != nil {
			return nil, fmt.Errorf("jetstream: connect: %w", err)
		}
		if js, err = natsjs.New(e.nc); err != nil {
			e.nc.Close()
			return nil, fmt.Errorf("jetstream: %w", err)
		}
	}
	e.js = js
	ctx, cancel := context.WithTimeout(context.Background(), cfg.requestTimeout)
	defer cancel()
	e.kv, err = js.CreateOrUpdateKeyValue(ctx, natsjs.KeyValueConfig{
		Bucket: e.names.bucket(), TTL: cfg.memberTTL, Storage: natsjs.MemoryStorage, History: 1,
	})
	if err != nil {
		if e.nc != nil {
			e.nc.Close()
		}
		return nil, fmt.Errorf("jetstream: membership bucket: %w", err)
	}
	e.deals, err = js.CreateOrUpdateKeyValue(ctx, natsjs.KeyValueConfig{
		Bucket: e.names.bucket() + "_deals", Storage: natsjs.MemoryStorage, History: 1,
	})
	if err != nil {
		if e.nc != nil {
			e.nc.Close()
		}
		return nil, fmt.Errorf("jetstream: assignment bucket: %w", err)
	}
	if ecfg.StuckAfter > 0 {
		e.stuck = newWatchdog(e, ecfg.StuckAfter)
		go e.stuck.run() // exits when Close halts it
	}
	return e, nil
}

// eng is one broker's engine: its topics and groups, on one connection.
type eng struct {
	cfg      config
	names    names
	retry    engine.RetryPolicy
	obs      engine.Observer // nil when nothing listens; called outside every lock
	stuck    *watchdog       // nil unless Config.StuckAfter is set (stuck.go)
	instance string          // this engine's random ID, the value of its membership keys
	nc       *nats.Conn      // owned; nil when the connection is the caller's
	js       natsjs.JetStream
	kv       natsjs.KeyValue // membership: a key per member, with TTL
	deals    natsjs.KeyValue // assignments: a key per group

	// handlerCtx is every handler's context; Close cancels it when it
	// gives up on draining.
	handlerCtx     context.Context
	cancelHandlers context.CancelFunc
	closing        chan struct{} // closed when Close begins

	mu      sync.Mutex // guards the fields below
	state   engine.State
	topics  map[string]*topic
	groups  map[groupKey]*group
	commits chan struct{} // closed and replaced on every local commit, for Drain

	closeOnce sync.Once
	closeErr  error
	// tail bounds, in Unix nanoseconds, the requests Close makes after
	// its workers stopped (what was left, the snapshots): so Close still
	// returns about when its ctx ends.
	tail atomic.Int64
}

type groupKey struct{ topic, group string }

var _ engine.Engine = (*eng)(nil)

// Capabilities: GiveBack, Observed (Config.Observer hears retries, dead
// letters, rebalances, backpressure, drops and skips, as this process
// sees them: see the package documentation), StuckDetection (of this
// process's deliveries: stuck.go) and Batches (batch.go). A
// delivery given back before the consumer
// received it (ErrNotDelivered) is kept by the partition's worker and
// delivered next with the same Attempt, also to the next local owner; it
// goes back to the server, still without counting (worker.go's giveBack),
// when the broker closes or the partition leaves it. The server stamps records (no
// InjectedClock) and names them by stream sequence (no CustomIDs). Block
// frees committed records one at a time, as the in-memory engine does,
// but waits by polling the server's ack floors, so a blocked publisher
// gets room within a poll of the slowest group's commit, not at once, and
// NewRecord reuses no buffers (no ExactBlock, no ReclaimOnCommit). The
// nats.go client cannot run in a synctest bubble (no VirtualTime).
func (e *eng) Capabilities() engine.Capabilities {
	return engine.GiveBack | engine.Observed | engine.StuckDetection | engine.Batches
}

func (e *eng) State() engine.State {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.state
}

// ctx returns a context bounded by the request timeout, for calls that
// take none, and by Close's tail once Close has stopped the workers.
func (e *eng) ctx() (context.Context, context.CancelFunc) {
	d := time.Now().Add(e.cfg.requestTimeout)
	if tail := e.tail.Load(); tail != 0 && tail < d.UnixNano() {
		d = time.Unix(0, tail)
	}
	return context.WithDeadline(context.Background(), d)
}

// committed wakes Drain: a local delivery settled.
func (e *eng) committed() {
	e.mu.Lock()
	close(e.commits)
	e.commits = make(chan struct{})
	e.mu.Unlock()
}

func (e *eng) commitSignal() <-chan struct{} {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.commits
}

func (e *eng) Group(ctx context.Context, topic, group string) (engine.Group, error) {
	e.mu.Lock()
	t := e.topics[topic]
	g := e.groups[groupKey{topic, group}]
	e.mu.Unlock()
	switch {
	case t == nil:
		return nil, fmt.Errorf("group %q of topic %q: %w", group, topic, engine.ErrTopicNotFound)
	case g != nil:
		return g, nil
	}
	// A group another broker created: known when its consumers exist.
	g, err := e.openGroup(ctx, t, group, nil)
	if err != nil {
		return nil, err
	}
	return g, nil
}

func (e *eng) localGroups() []*group {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]*group, 0, len(e.groups))
	for _, g := range e.groups {
		out = append(out, g)
	}
	slices.SortFunc(out, func(a, b *group) int {
		if c := cmpStr(a.t.name, b.t.name); c != 0 {
			return c
		}
		return cmpStr(a.name, b.name)
	})
	return out
}

func cmpStr(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Drain waits until every group this broker created or joined has
// committed, in every partition, every record published before the call,
// and delivered (or dead-lettered again) every redriven dead letter.
// Groups only other brokers use are not waited for. Local commits wake it;
// progress made by other processes is seen by polling the server every
// 20ms.
func (e *eng) Drain(ctx context.Context) error {
	return e.drain(ctx, false)
}

// drain is Drain; with skipStalled (Close) a stalled group is left
// behind instead of failing at once.
func (e *eng) drain(ctx context.Context, skipStalled bool) error {
	type target struct {
		g   *group
		p   int
		end uint64
	}
	var targets []target
	for _, g := range e.localGroups() {
		for p := range g.t.parts {
			info, err := g.t.streams[p].Info(ctx)
			if err != nil {
				return e.ctxErr(ctx, fmt.Errorf("drain: topic %q partition %d: %w", g.t.name, p, err))
			}
			targets = append(targets, target{g, p, info.State.LastSeq})
		}
		targets = append(targets, target{g: g, p: -1}) // its redriven dead letters, until none is left
	}
	stalled := map[*group]bool{}
	for {
		wake := e.commitSignal()
		var left []target
		for _, tg := range targets {
			if stalled[tg.g] {
				continue
			}
			if tg.p < 0 {
				rinfo, err := tg.g.rdq.Info(ctx)
				if err != nil {
					return e.ctxErr(ctx, fmt.Errorf("drain: group %q redrive stream: %w", tg.g.name, err))
				}
				if rinfo.State.Msgs == 0 {
					continue
				}
			}
			info, err := tg.g.consumers[max(tg.p, 0)].Info(ctx)
			if err != nil {
				return e.ctxErr(ctx, fmt.Errorf("drain: group %q partition %d: %w", tg.g.name, tg.p, err))
			}
			if tg.p >= 0 && settledTo(info, tg.end) {
				continue
			}
			if why := tg.g.stalled(ctx, info); why != "" {
				if !skipStalled {
					return fmt.Errorf("group %q on topic %q is %s with lag: %w", tg.g.name, tg.g.t.name, why, engine.ErrStalled)
				}
				stalled[tg.g] = true
				continue
			}
			left = append(left, tg)
		}
		if len(left) == 0 {
			if len(stalled) > 0 {
				var names []string
				for g := range stalled {
					names = append(names, fmt.Sprintf("%q", g.name))
				}
				slices.Sort(names)
				return fmt.Errorf("groups %v cannot make progress: %w", names, engine.ErrStalled)
			}
			return nil
		}
		targets = left
		t := time.NewTimer(20 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			var names []string
			for _, tg := range left {
				if tg.p < 0 {
					names = append(names, fmt.Sprintf("group %q redriven dead letters", tg.g.name))
					continue
				}
				names = append(names, fmt.Sprintf("group %q partition %d", tg.g.name, tg.p))
			}
			return fmt.Errorf("drain left %v: %w", slices.Compact(names), ctx.Err())
		case <-wake:
		case <-t.C:
		}
		t.Stop()
	}
}

// settledTo reports whether a consumer has settled every record up to
// sequence end: its ack floor is there, or it has delivered past end with
// nothing unacked (records retention removed are never acked). The
// server's NumPending is not used: it lags behind publishes.
func settledTo(info *natsjs.ConsumerInfo, end uint64) bool {
	return info.AckFloor.Stream >= end || info.Delivered.Stream >= end && info.NumAckPending == 0
}

// ctxErr prefers ctx's error, so a request cut short by ctx says so.
func (e *eng) ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
		return fmt.Errorf("%w (%v)", ctx.Err(), err)
	}
	return err
}

// closeGrace is how long Close waits, after ctx ended and handlers were
// cancelled, for them to return.
const closeGrace = 10 * time.Millisecond

// Close refuses new work, drains the groups that can make progress
// (bounded by ctx), stops every worker, removes this broker's consumers
// from their groups and closes the connection it owns. It returns by the
// time ctx ends plus closeGrace, and a *ShutdownError naming what this
// broker's groups had not committed.
func (e *eng) Close(ctx context.Context) error {
	e.closeOnce.Do(func() { e.closeErr = e.close(ctx) })
	return e.closeErr
}

func (e *eng) close(ctx context.Context) error {
	e.mu.Lock()
	e.state = engine.Draining
	e.mu.Unlock()
	close(e.closing)

	drainErr := e.drain(ctx, true)
	var stalled error
	if errors.Is(drainErr, engine.ErrStalled) {
		stalled = drainErr
	}
	// Stop every worker: they finish their delivery in flight. When ctx
	// ends first, handlers are cancelled and get closeGrace.
	groups := e.localGroups()
	var stopped []<-chan struct{}
	for _, g := range groups {
		stopped = append(stopped, g.shutdown())
	}
	all := make(chan struct{})
	go func() { // exits when every group's workers have exited
		for _, s := range stopped {
			<-s
		}
		close(all)
	}()
	var ctxErr error
	select {
	case <-all:
	case <-ctx.Done():
		ctxErr = ctx.Err()
		e.cancelHandlers()
		t := time.NewTimer(closeGrace)
		select {
		case <-all:
		case <-t.C:
		}
		t.Stop()
	}
	e.cancelHandlers()
	for _, g := range groups {
		g.closePullers()
	}
	if e.stuck != nil {
		e.stuck.halt()
	}

	// What was left: the server's view, bounded by a short tail so Close
	// still returns promptly: the rest of ctx, at most a second, or 100ms
	// when ctx has ended.
	tail := 100 * time.Millisecond
	if dl, ok := ctx.Deadline(); ctx.Err() == nil {
		tail = time.Second
		if ok {
			tail = max(min(tail, time.Until(dl)), 100*time.Millisecond)
		}
	}
	e.tail.Store(time.Now().Add(tail).UnixNano())
	var unfinished []engine.Unfinished
	rctx, cancel := e.ctx()
	for _, g := range groups {
		unfinished = append(unfinished, g.unfinished(rctx)...)
		g.leaveAll(rctx)
	}
	cancel()
	for _, g := range groups {
		g.takeSnap()
	}
	e.mu.Lock()
	topics := make([]*topic, 0, len(e.topics))
	for _, t := range e.topics {
		topics = append(topics, t)
	}
	e.mu.Unlock()
	for _, t := range topics {
		st := t.Stats()
		t.snap.Store(&st)
	}
	e.mu.Lock()
	e.state = engine.Stopped
	e.mu.Unlock()
	if e.nc != nil {
		e.nc.Close()
	}
	if len(unfinished) == 0 {
		if drainErr != nil && stalled == nil {
			// The drain failed (the server could not be asked) and what was
			// left is unknown: say so rather than claim success.
			return &engine.ShutdownError{Err: drainErr}
		}
		return nil
	}
	err := ctxErr
	if err == nil {
		err = stalled
	}
	if err == nil {
		err = drainErr
	}
	return &engine.ShutdownError{Unfinished: unfinished, Err: err}
}

// refuse reports ErrClosed once Close has begun.
func (e *eng) refuse(what string) error {
	select {
	case <-e.closing:
		return fmt.Errorf("%s: %w", what, engine.ErrClosed)
	default:
		return nil
	}
}
