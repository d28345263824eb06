package jetstream

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/logbus/logbus/engine"
	"github.com/logbus/logbus/internal/kit"
	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
)

// New returns an engine for pubsub.WithEngine on an existing JetStream
// context. Every broker opened with it shares js's connection, which it
// never closes: the caller owns the connection and closes it after the
// brokers.
func New(js natsjs.JetStream, opts ...Option) engine.Driver {
	return &opener{cfg: opts, js: js}
}

// Connect returns an engine for pubsub.WithEngine on an existing
// connection, as New does with jetstream.New(nc).
func Connect(nc *nats.Conn, opts ...Option) (engine.Driver, error) {
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
	e := &eng{cfg: cfg, names: names{prefix: encodeName(cfg.prefix)}, retry: retry, obs: ecfg.Observer, conn: conn{timeout: cfg.requestTimeout},
		topics: map[string]*topic{}, groups: map[groupKey]*group{}, retired: map[*group]bool{},
		closing: make(chan struct{}), commits: make(chan struct{})}
	e.handlerCtx, e.cancelHandlers = context.WithCancel(context.Background())
	e.stopCtx, e.stopCancel = context.WithCancel(context.Background())
	var id [6]byte
	_, _ = rand.Read(id[:])
	e.instance = hex.EncodeToString(id[:])
	js := o.js
	if o.dial != nil {
		if e.nc, err = o.dial(); err != nil {
			if unreachable(err) {
				err = fmt.Errorf("%w (%w)", err, engine.ErrUnavailable)
			}
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
	e.kv, err = e.createBucket(ctx, e.membersBucket())
	if err != nil {
		if e.nc != nil {
			e.nc.Close()
		}
		return nil, e.ctxErr(ctx, fmt.Errorf("jetstream: membership bucket: %w", err))
	}
	e.deals, err = e.createBucket(ctx, e.dealsBucket())
	if err != nil {
		if e.nc != nil {
			e.nc.Close()
		}
		return nil, e.ctxErr(ctx, fmt.Errorf("jetstream: assignment bucket: %w", err))
	}
	e.watchConnection()
	if ecfg.StuckAfter > 0 {
		e.stuck = kit.StartWatchdog(ecfg.StuckAfter, stuckProbe{e}, e.obs)
	}
	return e, nil
}

// membersBucket is the membership bucket's configuration: a key per
// member, expiring a TTL after its last heartbeat.
func (e *eng) membersBucket() natsjs.KeyValueConfig {
	return natsjs.KeyValueConfig{Bucket: e.names.bucket(), TTL: e.cfg.memberTTL, History: 1}
}

// dealsBucket is the assignment bucket's configuration: a key per group
// (assign.go), without TTL.
func (e *eng) dealsBucket() natsjs.KeyValueConfig {
	return natsjs.KeyValueConfig{Bucket: e.names.bucket() + "_deals", History: 1}
}

// ensureBuckets makes the membership and assignment buckets again when
// the server has lost them (memory storage, as older versions made them,
// across a restart of the server; a deletion), and reports whether it
// made one. The keys were lost with them: heartbeats create the members'
// again, and the next reconcile deals afresh. Groups call it when a
// reconcile fails; it asks the server at most once per MemberTTL/3 for
// the whole engine, each time bounded by MemberTTL/3.
func (e *eng) ensureBuckets() bool {
	e.bucketsMu.Lock()
	defer e.bucketsMu.Unlock()
	every := e.cfg.memberTTL / 3
	if time.Since(e.bucketsChecked) < every {
		return false
	}
	e.bucketsChecked = time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), every)
	defer cancel()
	made := false
	for _, cfg := range []natsjs.KeyValueConfig{e.membersBucket(), e.dealsBucket()} {
		if _, err := e.js.KeyValue(ctx, cfg.Bucket); errors.Is(err, natsjs.ErrBucketNotFound) {
			if _, err := e.createBucket(ctx, cfg); err == nil {
				made = true
			}
		}
	}
	return made
}

// eng is one broker's engine: its topics and groups, on one connection.
type eng struct {
	cfg      config
	names    names
	retry    engine.RetryPolicy
	obs      engine.Observer         // nil when nothing listens; called outside every lock
	stuck    *kit.Watchdog[stuckKey] // nil unless Config.StuckAfter is set (stuck.go)
	instance string                  // this engine's random ID, the value of its membership keys
	msgs     atomic.Uint64           // publishes made, for their message IDs (nextMsgID)
	conn                             // the connection (conn.go)
	kv       natsjs.KeyValue         // membership: a key per member, with TTL
	deals    natsjs.KeyValue         // assignments: a key per group

	bucketsMu      sync.Mutex // serialises ensureBuckets, guards bucketsChecked
	bucketsChecked time.Time  // when ensureBuckets last asked the server

	// handlerCtx is every handler's context; Close cancels it when it
	// gives up on draining.
	handlerCtx     context.Context
	cancelHandlers context.CancelFunc
	closing        chan struct{} // closed when Close begins

	mu      sync.Mutex // guards the fields below
	state   engine.State
	topics  map[string]*topic
	groups  map[groupKey]*group
	retired map[*group]bool // deleted groups until their workers exited (lifecycle.go: vanish)
	commits chan struct{}   // closed and replaced on every local commit, for Drain

	closer kit.Closer // runs Close once
	// Asynchronous publishing (async.go): every topic's pipes, by number;
	// the subscription that reads their answers, made on first use; the
	// context of their recoveries, which Close cancels, and the
	// recoveries running.
	pipesMu     sync.Mutex // serialises newPipes
	pipes       atomic.Pointer[[]*pipeline]
	replyMu     sync.Mutex // guards replySub and replyPrefix
	replySub    *nats.Subscription
	replyPrefix string
	stopCtx     context.Context
	stopCancel  context.CancelFunc
	recoveries  sync.WaitGroup
}

type groupKey struct{ topic, group string }

var _ engine.Engine = (*eng)(nil)

// Capabilities: GiveBack, Observed (Config.Observer hears retries, dead
// letters, rebalances, backpressure, drops and skips, as this process
// sees them: see the package documentation), StuckDetection (of this
// process's deliveries: stuck.go), Batches (batch.go), Snapshots,
// Redrive, Delete and DiscardDeadLetters. A delivery given back before
// the consumer received it (ErrNotDelivered) is kept by the partition's
// worker and delivered next with the same Attempt, also to the next local
// owner; it goes back to the server, still without counting (group.go's
// giveBack), when the broker closes or the partition leaves it.
// Retention is the server's: DropsOldest (discard-old), MaxAge (by the
// server's clock) and MaxBytes (the server counts a record's subject and
// headers too, so a partition holds less than RecordBytes allows). Block
// frees committed records one at a time, as the in-memory engine does
// (ReclaimOnCommit), but waits by polling the server's ack floors, so a
// blocked publisher gets room within a poll of the slowest group's
// commit, not at once (no ExactBlock). The server stamps records (no
// InjectedClock) and names them by stream sequence (no CustomIDs). The
// nats.go client cannot run in a synctest bubble (no VirtualTime).
// KeyConcurrency: keys.go.
func (e *eng) Capabilities() engine.Capabilities {
	return engine.GiveBack | engine.Observed | engine.StuckDetection | engine.Batches | engine.Snapshots |
		engine.Redrive | engine.Delete | engine.DiscardDeadLetters | engine.DropsOldest | engine.MaxAge |
		engine.MaxBytes | engine.ReclaimOnCommit | engine.KeyConcurrency
}

func (e *eng) State() engine.State {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.state
}

// nextMsgID returns the message ID of a new publish: unique to this
// broker (its random instance) and to the publish.
func (e *eng) nextMsgID() string {
	return e.instance + "-" + strconv.FormatUint(e.msgs.Add(1), 36)
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

func (e *eng) Subscribe(ctx context.Context, topic, group, consumer string, h engine.Handler, onLeave func(), spec engine.GroupSpec) (engine.Group, error) {
	if h == nil {
		return nil, fmt.Errorf("nil handler: %w", engine.ErrSubscription)
	}
	return e.subscribe(ctx, topic, group, &member{name: consumer, h: h, onLeave: onLeave}, spec)
}

// SubscribeBatch is Subscribe for a consumer whose handler takes batches
// ([engine.BatchSubscriber]): see batch.go.
func (e *eng) SubscribeBatch(ctx context.Context, topic, group, consumer string, h engine.BatchHandler, onLeave func(), spec engine.GroupSpec, batch engine.BatchSpec) (engine.Group, error) {
	if h == nil {
		return nil, fmt.Errorf("nil handler: %w", engine.ErrSubscription)
	}
	batch, err := batch.Resolve()
	if err != nil {
		return nil, err
	}
	if spec.KeyConcurrency > 1 {
		// A batch is already a unit of concurrency: its records are handled
		// together and committed together.
		return nil, fmt.Errorf("group %q: %w: a batch consumer cannot have key concurrency (%d)", group, engine.ErrInvalid, spec.KeyConcurrency)
	}
	return e.subscribe(ctx, topic, group, &member{name: consumer, bh: h, batch: batch, onLeave: onLeave}, spec)
}

// subscribe joins m, a member not yet in any group, to the group.
func (e *eng) subscribe(ctx context.Context, topic, group string, m *member, spec engine.GroupSpec) (engine.Group, error) {
	consumer := m.name
	what := fmt.Sprintf("subscribe %q to group %q", consumer, group)
	if err := e.refuse(what); err != nil {
		return nil, err
	}
	switch {
	case group == "":
		return nil, fmt.Errorf("empty group name: %w", engine.ErrSubscription)
	case consumer == "":
		return nil, fmt.Errorf("empty consumer name: %w", engine.ErrSubscription)
	}
	e.mu.Lock()
	t := e.topics[topic]
	g := e.groups[groupKey{topic, group}]
	e.mu.Unlock()
	if t == nil {
		return nil, fmt.Errorf("topic %q: %w", topic, engine.ErrTopicNotFound)
	}
	if err := e.names.checkGroup(topic, group, consumer, t.parts); err != nil {
		return nil, err
	}
	spec, err := spec.Resolve(e.retry)
	if err != nil {
		return nil, fmt.Errorf("group %q: %w", group, err)
	}
	if g == nil {
		if g, err = openGroup(ctx, e, t, group, &spec); err != nil {
			return nil, err
		}
	} else if !g.spec.Equal(spec) {
		return nil, fmt.Errorf("group %q exists with other options: %w", group, engine.ErrSubscription)
	}
	if err := g.members.join(ctx, m); err != nil {
		return nil, err
	}
	return g, nil
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
	g, err := openGroup(ctx, e, t, group, nil)
	if err != nil {
		return nil, err
	}
	return g, nil
}

// localGroups returns the groups this broker created, joined or named,
// sorted by topic, then name.
func (e *eng) localGroups() []*group {
	e.mu.Lock()
	out := slices.Collect(maps.Values(e.groups))
	e.mu.Unlock()
	slices.SortFunc(out, func(a, b *group) int { return cmp.Or(cmp.Compare(a.t.name, b.t.name), cmp.Compare(a.name, b.name)) })
	return out
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

// drain is Drain. For Close (closing set), a stalled group is left
// behind instead of failing at once, and a group with live members in
// other brokers is waited for only in the partitions this broker's
// members own: the others carry on with the rest, and take over those
// once this broker left.
func (e *eng) drain(ctx context.Context, closing bool) error {
	type target struct {
		g   *group
		p   int
		end uint64
	}
	var targets []target
	groups := e.localGroups()
	// left names what the drain had not seen settled when ctx ended (also
	// when it ended during a request): the targets, or every group before
	// the targets are known.
	left := func(tgs []target) error {
		var names []string
		if tgs == nil {
			for _, g := range groups {
				names = append(names, fmt.Sprintf("group %q of topic %q", g.name, g.t.name))
			}
		}
		for _, tg := range tgs {
			if tg.p < 0 {
				names = append(names, fmt.Sprintf("group %q of topic %q: its redriven dead letters", tg.g.name, tg.g.t.name))
				continue
			}
			names = append(names, fmt.Sprintf("group %q of topic %q partition %d", tg.g.name, tg.g.t.name, tg.p))
		}
		slices.Sort(names)
		return fmt.Errorf("drain left %s: %w", strings.Join(slices.Compact(names), ", "), ctx.Err())
	}
	for _, g := range groups {
		mine := g.members.drainedByClose()
		for p := range g.t.parts {
			if closing && mine != nil && !mine[p] {
				continue
			}
			info, err := g.t.streamInfo(ctx, p)
			if errors.Is(err, natsjs.ErrStreamNotFound) && g.fate.serverErr(ctx, err) != nil {
				break // deleted, by another broker: nothing to wait for
			}
			if err != nil && ctx.Err() != nil && !e.unavailable(ctx, err) {
				return left(nil)
			}
			if err != nil {
				return e.ctxErr(ctx, fmt.Errorf("drain: topic %q partition %d: %w", g.t.name, p, err))
			}
			targets = append(targets, target{g, p, info.State.LastSeq})
		}
		if !closing || mine == nil {
			targets = append(targets, target{g: g, p: -1}) // its redriven dead letters, until none is left
		}
	}
	stalled := map[*group]bool{}
	for {
		wake := e.commitSignal()
		var rest []target
		for i, tg := range targets {
			if stalled[tg.g] || tg.g.fate.gone() { // a deleted group has nothing to wait for
				continue
			}
			if tg.p < 0 {
				rinfo, err := tg.g.redrive.rdq.Info(ctx)
				if err != nil && ctx.Err() != nil && !e.unavailable(ctx, err) {
					return left(append(rest, targets[i:]...))
				}
				if err != nil {
					return e.ctxErr(ctx, fmt.Errorf("drain: group %q redrive stream: %w", tg.g.name, err))
				}
				if rinfo.State.Msgs == 0 {
					continue
				}
			}
			info, err := tg.g.seen.consumerInfo(ctx, max(tg.p, 0))
			if err != nil && tg.g.fate.gone() {
				continue // deleted meanwhile, by another broker
			}
			if err != nil && ctx.Err() != nil && !e.unavailable(ctx, err) {
				return left(append(rest, targets[i:]...))
			}
			if err != nil {
				return e.ctxErr(ctx, fmt.Errorf("drain: group %q partition %d: %w", tg.g.name, tg.p, err))
			}
			if tg.p >= 0 && settledTo(info, tg.end) {
				continue
			}
			if why := tg.g.seen.stalled(ctx, info); why != "" {
				if !closing {
					return fmt.Errorf("group %q on topic %q is %s with lag: %w", tg.g.name, tg.g.t.name, why, engine.ErrStalled)
				}
				stalled[tg.g] = true
				continue
			}
			rest = append(rest, tg)
		}
		if len(rest) == 0 {
			if len(stalled) > 0 {
				var names []string
				for g := range stalled {
					names = append(names, fmt.Sprintf("%q", g.name))
				}
				slices.Sort(names)
				return fmt.Errorf("groups %s cannot make progress: %w", strings.Join(names, ", "), engine.ErrStalled)
			}
			return nil
		}
		targets = rest
		t := time.NewTimer(20 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return left(rest)
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

// Close refuses new work, drains the groups that can make progress
// (bounded by ctx: see drain), stops every worker, removes this broker's
// consumers from their groups and closes the connection it owns. It
// returns by the time ctx ends plus [kit.CloseGrace], also when the server
// cannot be reached, and a *ShutdownError naming the partitions of this
// broker's groups that no other broker carries on and that had not
// committed everything (see close). It runs once ([kit.Closer]): later and
// concurrent calls wait for the first, bounded by their own ctx, and
// return its result.
func (e *eng) Close(ctx context.Context) error {
	return e.closer.Close(ctx, func() error { return e.close(ctx) })
}

func (e *eng) close(ctx context.Context) error {
	e.mu.Lock()
	e.state = engine.Draining
	e.mu.Unlock()
	close(e.closing)
	// The typed layer waited for the records in flight (bounded by ctx):
	// what is left is resolved now.
	e.stopPipes()

	drainErr := e.drain(ctx, true)
	var stalled error
	if errors.Is(drainErr, engine.ErrStalled) {
		stalled = drainErr
	}
	// Stop every worker: they finish their delivery in flight. When ctx
	// ends first, handlers are cancelled and get [kit.CloseGrace].
	groups := e.localGroups()
	var stopped []<-chan struct{}
	for _, g := range groups {
		stopped = append(stopped, g.members.shutdown())
	}
	e.mu.Lock()
	for g := range e.retired { // deleted groups whose deliveries still run: Close waits for them too
		stopped = append(stopped, g.members.shutdown())
	}
	e.mu.Unlock()
	ctxErr := kit.AwaitWorkers(ctx, func(ctx context.Context) error {
		for _, s := range stopped {
			select {
			case <-s:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	}, e.cancelHandlers)
	e.cancelHandlers()
	for _, g := range groups {
		g.closePullers()
	}
	if e.stuck != nil {
		e.stuck.Halt()
	}

	// What was left, and this broker's members out of their groups: asked
	// of the server in a tail that ends with ctx (at most a second), or,
	// once ctx ended, within [kit.CloseGrace] of its end. While the
	// connection is down nothing more waits on the server, so Close keeps
	// its bound: what was left is then as last observed (the drain polled
	// it, and this broker's publishes count), and the members' keys are
	// left to expire after MemberTTL, as a crashed broker's do; the keys
	// are deleted without waiting for the answer once the tail is spent.
	end := time.Now().Add(time.Second)
	if dl, ok := ctx.Deadline(); ok && dl.Before(end) {
		end = dl
	}
	if ctx.Err() != nil {
		end = time.Now().Add(kit.CloseGrace)
		if dl, ok := ctx.Deadline(); ok && errors.Is(ctx.Err(), context.DeadlineExceeded) {
			end = dl.Add(kit.CloseGrace)
		}
	}
	if !e.connected() {
		end = time.Now()
	}
	e.tail.Store(end.UnixNano())
	var unfinished []engine.Unfinished
	r, cancel := e.read()
	for _, g := range groups {
		unfinished = append(unfinished, g.seen.unfinished(r)...)
		g.members.leaveAll(r)
	}
	for _, g := range groups {
		g.seen.takeSnap(r)
	}
	e.mu.Lock()
	topics := slices.Collect(maps.Values(e.topics))
	e.mu.Unlock()
	for _, t := range topics {
		t.stats(r)
	}
	cancel()
	connected := e.connected()
	drainDown := drainErr != nil && e.unavailable(ctx, drainErr)
	e.tail.Store(time.Now().UnixNano()) // from now on the reads answer from what Close saw
	e.mu.Lock()
	e.state = engine.Stopped
	e.mu.Unlock()
	e.stopWatching()
	if e.nc != nil {
		e.nc.Close()
	}
	// The error names what was left, and only that: the partitions listed,
	// and why (ctx's error, the stalled groups, or the server's). When the
	// server could not be reached, what was left is as last observed, and
	// the error wraps ErrUnavailable: nil means the server confirmed that
	// nothing was left.
	cause := cmpErr(ctxErr, stalled, drainErr)
	if !connected || r.failed || drainDown {
		switch {
		case cause == nil:
			cause = engine.ErrUnavailable
		case !errors.Is(cause, engine.ErrUnavailable):
			cause = fmt.Errorf("%w (%w)", cause, engine.ErrUnavailable)
		}
	}
	if len(unfinished) > 0 {
		return &engine.ShutdownError{Unfinished: unfinished, Err: cause}
	}
	if cause != nil && stalled == nil && (ctxErr == nil || errors.Is(cause, engine.ErrUnavailable)) {
		return fmt.Errorf("close: nothing was left undelivered as last observed, but the server could not confirm it: %w", cause)
	}
	return nil
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
