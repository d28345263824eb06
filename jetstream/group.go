package jetstream

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/logbus/logbus/internal/engine"
	natsjs "github.com/nats-io/nats.go/jetstream"
)

// priorityGroup is the one priority group of every consumer: with the
// pinned-client policy the server serves one client at a time, whatever
// the members believe about the assignment.
const priorityGroup = "logbus"

// group is a consumer group as this broker sees it: the server holds its
// consumers (one durable consumer per partition), its offsets, its pause
// and its dead letters; this broker holds its local members and their
// workers.
type group struct {
	e         *eng
	t         *topic
	name      string
	spec      engine.GroupSpec // as created, resolved
	consumers []natsjs.Consumer
	dlq       natsjs.Stream
	slots     []*slot

	// recMu serialises reconcile, which Subscribe, Leave, the loop and
	// exiting workers all call.
	recMu sync.Mutex

	mu       sync.Mutex // guards the fields below; never held across a server request or user code
	members  map[string]*member
	assign   map[string][]int // the last assignment computed, of every live member
	paused   bool             // Pause holds every slot
	pausedOn bool             // and the server confirmed the pause: from then on a resume by another broker releases the holds
	closed   bool             // shutdown began
	loopStop chan struct{}    // nil until the first local member joins
	loopDone chan struct{}
	letters  map[string]error // dead letters this process made, by letter ID: their original errors

	wake chan struct{} // buffered 1: the loop reconciles soon

	delivered, retried, deadLettered, skipped atomic.Int64

	snap atomic.Pointer[groupSnap] // what the reads return once the broker stopped
}

// groupSnap is a group's state as Close left it: after Close the reads
// (Committed, Lag, Stats, DeadLetters) answer from it, since the
// connection may be gone.
type groupSnap struct {
	committed []int64
	lag       int64
	evicted   int64
	letters   []engine.DeadLetter
}

// takeSnap records the group's state for the reads after Close.
func (g *group) takeSnap() {
	s := &groupSnap{committed: make([]int64, g.t.parts), lag: g.Lag(), letters: g.DeadLetters()}
	for p := range s.committed {
		s.committed[p] = g.Committed(p)
	}
	s.evicted = g.Stats().DeadLettersEvicted
	g.snap.Store(s)
}

// member is a consumer of this broker in the group.
type member struct {
	name    string
	key     string
	h       engine.Handler
	onLeave func()
	rev     uint64 // of its membership key
	left    bool
	evicted bool // its key expired and another broker took the name: it owns nothing
}

// storedSpec is what a group's consumers carry in their metadata, so that
// a broker joining an existing group can tell whether its options match.
const metaSpec = "logbus_spec"

func (e *eng) Subscribe(ctx context.Context, topic, group, consumer string, h engine.Handler, onLeave func(), spec engine.GroupSpec) (engine.Group, error) {
	what := fmt.Sprintf("subscribe %q to group %q", consumer, group)
	if err := e.refuse(what); err != nil {
		return nil, err
	}
	switch {
	case group == "":
		return nil, fmt.Errorf("empty group name: %w", engine.ErrSubscription)
	case consumer == "":
		return nil, fmt.Errorf("empty consumer name: %w", engine.ErrSubscription)
	case h == nil:
		return nil, fmt.Errorf("nil handler: %w", engine.ErrSubscription)
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
	if g == nil {
		var err error
		if g, err = e.openGroup(ctx, t, group, &spec); err != nil {
			return nil, err
		}
	} else if !g.spec.Equal(resolveSpec(e, spec)) {
		return nil, fmt.Errorf("group %q exists with other options: %w", group, engine.ErrSubscription)
	}
	if err := g.join(ctx, consumer, h, onLeave); err != nil {
		return nil, err
	}
	return g, nil
}

// resolveSpec fills a group spec's zero fields as the group will use them.
func resolveSpec(e *eng, spec engine.GroupSpec) engine.GroupSpec {
	if spec.Retry == (engine.RetryPolicy{}) {
		spec.Retry = e.retry
	} else if r, err := spec.Retry.Resolve(); err == nil {
		spec.Retry = r
	}
	if spec.DeadLetterLimit == 0 {
		spec.DeadLetterLimit = engine.DefaultDeadLetterLimit
	}
	return spec
}

// openGroup finds the group's consumers on the server, creating them (and
// its dead-letter stream) when spec is not nil, and registers the group
// in the broker. A nil spec with no consumers is ErrSubscription.
func (e *eng) openGroup(ctx context.Context, t *topic, name string, spec *engine.GroupSpec) (*group, error) {
	g := &group{e: e, t: t, name: name, members: map[string]*member{}, letters: map[string]error{},
		wake: make(chan struct{}, 1), consumers: make([]natsjs.Consumer, t.parts), slots: make([]*slot, t.parts)}
	for p := range g.slots {
		g.slots[p] = newSlot(p)
	}
	if spec != nil {
		if _, err := spec.Retry.Resolve(); err != nil {
			return nil, fmt.Errorf("group %q: %w", name, err)
		}
		if spec.DeadLetterLimit < 0 {
			return nil, fmt.Errorf("%w: group %q: dead-letter limit %d", engine.ErrInvalid, name, spec.DeadLetterLimit)
		}
		if err := spec.Start.Validate(); err != nil {
			return nil, fmt.Errorf("group %q: %w", name, err)
		}
		g.spec = resolveSpec(e, *spec)
	}
	created := false
	for p := range t.parts {
		c, err := e.js.Consumer(ctx, e.names.stream(t.name, p), e.names.consumer(name, p))
		if errors.Is(err, natsjs.ErrConsumerNotFound) && spec != nil {
			cfg := g.consumerConfig(p)
			if spec.Start.Kind != engine.StartEarliest {
				// Created paused, until it is moved to its start below: a
				// member of another broker that joins meanwhile must not
				// read from the first record.
				until := time.Now().Add(100 * 365 * 24 * time.Hour)
				cfg.PauseUntil = &until
			}
			c, err = e.js.CreateConsumer(ctx, e.names.stream(t.name, p), cfg)
			created = err == nil
		}
		if errors.Is(err, natsjs.ErrConsumerNotFound) {
			return nil, fmt.Errorf("no group %q on topic %q: %w", name, t.name, engine.ErrSubscription)
		}
		if err != nil {
			return nil, e.ctxErr(ctx, fmt.Errorf("group %q partition %d: %w", name, p, err))
		}
		var stored engine.GroupSpec
		if err := json.Unmarshal([]byte(c.CachedInfo().Config.Metadata[metaSpec]), &stored); err != nil {
			return nil, fmt.Errorf("group %q partition %d: consumer not made by logbus: %w", name, p, engine.ErrSubscription)
		}
		if spec == nil {
			g.spec = stored
		} else if !stored.Equal(g.spec) {
			return nil, fmt.Errorf("group %q exists with other options: %w", name, engine.ErrSubscription)
		}
		g.consumers[p] = c
	}
	var err error
	g.dlq, err = e.js.CreateOrUpdateStream(ctx, natsjs.StreamConfig{
		Name:      e.names.dlqStream(t.name, name),
		Subjects:  []string{e.names.dlqSubject(t.name, name)},
		Retention: natsjs.LimitsPolicy,
		MaxMsgs:   int64(g.spec.DeadLetterLimit),
		Discard:   natsjs.DiscardOld,
		Storage:   t.streamConfig(0).Storage,
	})
	if err != nil {
		return nil, e.ctxErr(ctx, fmt.Errorf("group %q: dead-letter stream: %w", name, err))
	}
	if created && spec != nil && spec.Start.Kind != engine.StartEarliest {
		// The consumers deliver from the first record; move them to the
		// start before any member pulls (their members join after this).
		seqs, err := g.startSeqs(ctx, spec.Start)
		if err != nil {
			return nil, err
		}
		for p, seq := range seqs {
			if _, err := t.streams[p].ResetConsumerToSequence(ctx, e.names.consumer(name, p), seq); err != nil {
				return nil, e.ctxErr(ctx, fmt.Errorf("group %q partition %d: start at %v: %w", name, p, spec.Start, err))
			}
			if _, err := t.streams[p].ResumeConsumer(ctx, e.names.consumer(name, p)); err != nil {
				return nil, e.ctxErr(ctx, fmt.Errorf("group %q partition %d: %w", name, p, err))
			}
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if cur := e.groups[groupKey{t.name, name}]; cur != nil { // a concurrent Subscribe won
		return cur, nil
	}
	e.groups[groupKey{t.name, name}] = g
	return g, nil
}

func (g *group) consumerConfig(p int) natsjs.ConsumerConfig {
	spec, _ := json.Marshal(g.spec)
	return natsjs.ConsumerConfig{
		Durable:        g.e.names.consumer(g.name, p),
		FilterSubject:  g.e.names.subject(g.t.name, p),
		AckPolicy:      natsjs.AckExplicitPolicy,
		AckWait:        g.e.cfg.ackWait,
		MaxDeliver:     -1, // the engine dead-letters; see worker.settle
		MaxAckPending:  1,  // one record in flight per partition: order under retries and failover
		DeliverPolicy:  natsjs.DeliverAllPolicy,
		PriorityGroups: []string{priorityGroup},
		PriorityPolicy: natsjs.PriorityPolicyPinned,
		PinnedTTL:      g.e.cfg.memberTTL,
		Metadata:       map[string]string{"logbus_group": g.name, metaSpec: string(spec)},
	}
}

// startSeqs returns, per partition, the stream sequence start names.
func (g *group) startSeqs(ctx context.Context, start engine.Start) ([]uint64, error) {
	seqs := make([]uint64, g.t.parts)
	for p, s := range g.t.streams {
		info, err := s.Info(ctx)
		if err != nil {
			return nil, g.e.ctxErr(ctx, fmt.Errorf("topic %q partition %d: %w", g.t.name, p, err))
		}
		first, last := info.State.FirstSeq, info.State.LastSeq
		if first == 0 {
			first = 1
		}
		switch start.Kind {
		case engine.StartEarliest:
			seqs[p] = first
		case engine.StartLatest:
			seqs[p] = last + 1
		case engine.StartOffset:
			seqs[p] = min(max(uint64(start.Offset)+1, first), last+1)
		case engine.StartTime:
			seq, err := g.seqAtTime(ctx, s, first, last, start.Time)
			if err != nil {
				return nil, err
			}
			seqs[p] = seq
		}
	}
	return seqs, nil
}

// seqAtTime returns the first sequence in [first, last] stored at or
// after t (last+1 when none): a binary search over the server's
// timestamps.
func (g *group) seqAtTime(ctx context.Context, s natsjs.Stream, first, last uint64, t time.Time) (uint64, error) {
	lo, hi := first, last+1
	for lo < hi {
		mid := lo + (hi-lo)/2
		m, err := s.GetMsg(ctx, mid)
		if errors.Is(err, natsjs.ErrMsgNotFound) { // gone meanwhile: older than anything left
			lo = mid + 1
			continue
		}
		if err != nil {
			return 0, g.e.ctxErr(ctx, fmt.Errorf("topic %q: find time %v: %w", g.t.name, t, err))
		}
		if m.Time.Before(t) {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo, nil
}

func (g *group) Name() string { return g.name }

// join adds a local member: its membership key, then a reconcile, so the
// assignment includes it when Subscribe returns.
func (g *group) join(ctx context.Context, consumer string, h engine.Handler, onLeave func()) error {
	key := g.e.names.memberKey(g.t.name, g.name, consumer)
	g.mu.Lock()
	switch {
	case g.closed:
		g.mu.Unlock()
		return fmt.Errorf("subscribe %q to group %q: %w", consumer, g.name, engine.ErrClosed)
	case g.members[consumer] != nil:
		g.mu.Unlock()
		return fmt.Errorf("consumer %q is already in group %q: %w", consumer, g.name, engine.ErrSubscription)
	}
	m := &member{name: consumer, key: key, h: h, onLeave: onLeave}
	g.members[consumer] = m // reserved; not yet live
	g.mu.Unlock()
	rev, err := g.e.kv.Create(ctx, key, []byte(g.e.instance))
	if err != nil {
		g.mu.Lock()
		delete(g.members, consumer)
		g.mu.Unlock()
		if errors.Is(err, natsjs.ErrKeyExists) {
			return fmt.Errorf("consumer %q is already in group %q (in another broker, or one that stopped less than a member TTL ago): %w",
				consumer, g.name, engine.ErrSubscription)
		}
		return g.e.ctxErr(ctx, fmt.Errorf("subscribe %q to group %q: %w", consumer, g.name, err))
	}
	g.mu.Lock()
	m.rev = rev
	if g.loopStop == nil {
		g.loopStop, g.loopDone = make(chan struct{}), make(chan struct{})
		go g.loop(g.loopStop, g.loopDone) // exits when shutdown closes loopStop
	}
	g.mu.Unlock()
	g.reconcile()
	return nil
}

// loop heartbeats the local members and reconciles the assignment with
// the live membership: whenever a membership key or the group's deal
// changes on the server (watched), whenever woken, and every tick (which
// also catches keys that expired), until stop closes.
func (g *group) loop(stop, done chan struct{}) {
	defer close(done)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	prefix := g.e.names.memberPrefix(g.t.name, g.name)
	var members, deals <-chan natsjs.KeyValueEntry
	if w, err := g.e.kv.WatchFiltered(ctx, []string{prefix + "*"}, natsjs.UpdatesOnly(), natsjs.MetaOnly()); err == nil {
		defer w.Stop()
		members = w.Updates()
	}
	if w, err := g.e.deals.Watch(ctx, prefix+"deal", natsjs.UpdatesOnly(), natsjs.MetaOnly()); err == nil {
		defer w.Stop()
		deals = w.Updates()
	}
	beatEvery := g.e.cfg.memberTTL / 3
	tick := time.NewTicker(min(100*time.Millisecond, beatEvery))
	defer tick.Stop()
	lastBeat := time.Now()
	for {
		select {
		case <-stop:
			return
		case <-g.wake:
		case _, ok := <-members:
			if !ok {
				members = nil
			}
		case _, ok := <-deals:
			if !ok {
				deals = nil
			}
		case <-tick.C:
			if time.Since(lastBeat) >= beatEvery {
				g.heartbeat()
				g.followResume()
				lastBeat = time.Now()
			}
		}
		g.reconcile()
	}
}

// heartbeat refreshes every local member's key. A key that expired (this
// process stalled past the TTL) is created again; one another broker took
// meanwhile leaves that member without partitions.
func (g *group) heartbeat() {
	g.mu.Lock()
	ms := make([]*member, 0, len(g.members))
	for _, m := range g.members {
		ms = append(ms, m)
	}
	g.mu.Unlock()
	ctx, cancel := g.e.ctx()
	defer cancel()
	for _, m := range ms {
		rev, err := g.e.kv.Update(ctx, m.key, []byte(g.e.instance), m.rev)
		if err != nil {
			rev, err = g.e.kv.Create(ctx, m.key, []byte(g.e.instance))
		}
		g.mu.Lock()
		switch {
		case err == nil:
			m.rev, m.evicted = rev, false
		case errors.Is(err, natsjs.ErrKeyExists):
			m.evicted = true
		}
		g.mu.Unlock()
	}
}

// liveMembers lists the group's members across brokers, sorted, from the
// membership bucket.
func (g *group) liveMembers(ctx context.Context) ([]string, map[string]bool, error) {
	prefix := g.e.names.memberPrefix(g.t.name, g.name)
	lister, err := g.e.kv.ListKeysFiltered(ctx, prefix+"*")
	if err != nil {
		return nil, nil, err
	}
	defer lister.Stop()
	var names []string
	for k := range lister.Keys() {
		names = append(names, decodeName(strings.TrimPrefix(k, prefix)))
	}
	slices.Sort(names)
	names = slices.Compact(names)
	set := make(map[string]bool, len(names))
	for _, n := range names {
		set[n] = true
	}
	return names, set, nil
}

// reconcile computes the assignment from the live membership and makes
// the local workers follow it: a worker whose partition moved is told to
// stop (it finishes its delivery in flight), and a partition this broker
// now owns gets a worker once the previous one has exited.
func (g *group) reconcile() {
	g.recMu.Lock()
	defer g.recMu.Unlock()
	ctx, cancel := g.e.ctx()
	live, _, err := g.liveMembers(ctx)
	var d deal
	if err == nil {
		d, err = g.currentDeal(ctx, live)
	}
	cancel()
	if err != nil {
		return
	}
	assign := d.byMember()
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return
	}
	g.assign = assign
	want := make([]*member, g.t.parts)
	for name, ps := range assign {
		if m := g.members[name]; m != nil && m.rev != 0 && !m.left && !m.evicted {
			for _, p := range ps {
				want[p] = m
			}
		}
	}
	for p, s := range g.slots {
		w := s.worker
		switch {
		case w != nil && w.m != want[p]:
			w.signalStop()
		case w == nil && want[p] != nil:
			s.worker = newWorker(g, s, want[p])
			go s.worker.run() // exits when signalStop is called and its delivery in flight is done
		}
	}
}

// exited is called by a worker that stopped: the slot is free, and the
// partition is unpinned unless a local member owns it now.
func (g *group) exited(w *worker) {
	g.mu.Lock()
	if w.s.worker == w {
		w.s.worker = nil
	}
	var giveBack natsjs.Msg
	if g.closed { // a record kept for the next local worker goes back to the server
		w.s.mu.Lock()
		giveBack, w.s.pending = w.s.pending, nil
		w.s.mu.Unlock()
	}
	keep := false
	for name, ps := range g.assign {
		if m := g.members[name]; m != nil && !m.left && slices.Contains(ps, w.s.p) && !g.closed {
			keep = true
		}
	}
	g.mu.Unlock()
	if giveBack != nil {
		_ = giveBack.Nak()
	}
	if !keep && !w.crashed() {
		ctx, cancel := g.e.ctx()
		_ = g.t.streams[w.s.p].UnpinConsumer(ctx, g.e.names.consumer(g.name, w.s.p), priorityGroup)
		cancel()
	}
	select {
	case g.wake <- struct{}{}:
	default:
	}
}

// Leave removes consumer: its key goes, its workers finish their delivery
// in flight and stop, and the partitions move to the remaining members.
// When ctx ends first it has left all the same; onLeave runs once the
// workers exited.
func (g *group) Leave(ctx context.Context, consumer string) error {
	if err := g.e.refuse(fmt.Sprintf("leave group %q", g.name)); err != nil {
		return err
	}
	g.mu.Lock()
	m := g.members[consumer]
	if m == nil || m.left {
		g.mu.Unlock()
		return fmt.Errorf("no consumer %q in group %q: %w", consumer, g.name, engine.ErrSubscription)
	}
	m.left = true
	delete(g.members, consumer)
	var done []<-chan struct{}
	for _, s := range g.slots {
		if w := s.worker; w != nil && w.m == m {
			w.signalStop()
			done = append(done, w.done)
		}
	}
	g.mu.Unlock()
	rctx, cancel := g.e.ctx()
	_ = g.e.kv.Delete(rctx, m.key)
	cancel()
	g.reconcile()
	all := waitAll(done)
	select {
	case <-all:
		if m.onLeave != nil {
			m.onLeave()
		}
		return nil
	case <-ctx.Done():
		if m.onLeave != nil {
			go func() { // exits when the consumer's last worker has
				<-all
				m.onLeave()
			}()
		}
		return fmt.Errorf("leave group %q: consumer %q has left; its deliveries in flight go on: %w", g.name, consumer, ctx.Err())
	}
}

// waitAll returns a channel closed once every channel of chs is.
func waitAll(chs []<-chan struct{}) <-chan struct{} {
	all := make(chan struct{})
	if len(chs) == 0 {
		close(all)
		return all
	}
	go func() { // exits when the last of chs closes
		for _, c := range chs {
			<-c
		}
		close(all)
	}()
	return all
}

// Assignment returns the last assignment computed, over every live member
// of the group in every broker (refreshed on every tick of the loop).
func (g *group) Assignment() map[string][]int {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make(map[string][]int, len(g.assign))
	for m, ps := range g.assign {
		out[m] = slices.Clone(ps)
	}
	return out
}

// Pause pauses the group's consumers on the server, so no broker gets
// records until Resume, and waits for this broker's deliveries in flight.
// When ctx ends first, the group is paused all the same.
func (g *group) Pause(ctx context.Context) error {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return nil
	}
	if !g.paused {
		g.paused = true
		for _, s := range g.slots {
			s.hold()
		}
	}
	g.mu.Unlock()
	until := time.Now().Add(100 * 365 * 24 * time.Hour)
	for p, s := range g.t.streams {
		if _, err := s.PauseConsumer(ctx, g.e.names.consumer(g.name, p), until); err != nil {
			return g.e.ctxErr(ctx, fmt.Errorf("partition %d: %w", p, err))
		}
	}
	g.mu.Lock()
	g.pausedOn = g.paused
	g.mu.Unlock()
	for _, s := range g.slots {
		if err := s.waitIdle(ctx, false); err != nil {
			return fmt.Errorf("deliveries in flight go on: %w", err)
		}
	}
	return nil
}

// followResume releases this broker's holds when the group was paused
// here but another broker resumed it on the server.
func (g *group) followResume() {
	g.mu.Lock()
	on := g.pausedOn
	g.mu.Unlock()
	if !on {
		return
	}
	ctx, cancel := g.e.ctx()
	info, err := g.consumers[0].Info(ctx)
	cancel()
	if err != nil || info.Paused {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.paused && g.pausedOn {
		g.paused, g.pausedOn = false, false
		for _, s := range g.slots {
			s.unhold()
		}
	}
}

// Resume resumes the group's consumers on the server.
func (g *group) Resume(ctx context.Context) error {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return nil
	}
	g.mu.Unlock()
	for p, s := range g.t.streams {
		if _, err := s.ResumeConsumer(ctx, g.e.names.consumer(g.name, p)); err != nil {
			return g.e.ctxErr(ctx, fmt.Errorf("partition %d: %w", p, err))
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.paused {
		g.paused, g.pausedOn = false, false
		for _, s := range g.slots {
			s.unhold()
		}
	}
	return nil
}

// Seek moves partition's consumer so that offset is read next.
func (g *group) Seek(ctx context.Context, partition int, offset int64) error {
	if err := g.e.refuse("seek"); err != nil {
		return err
	}
	if partition < 0 || partition >= g.t.parts {
		return fmt.Errorf("%w: topic %q has no partition %d", engine.ErrInvalid, g.t.name, partition)
	}
	info, err := g.t.streams[partition].Info(ctx)
	if err != nil {
		return g.e.ctxErr(ctx, err)
	}
	first, last := info.State.FirstSeq, info.State.LastSeq
	if first == 0 {
		first = 1
	}
	if offset < int64(first)-1 || offset > int64(last) {
		return fmt.Errorf("offset %d outside [%d, %d]: %w", offset, int64(first)-1, last, engine.ErrOffsetOutOfRange)
	}
	return g.reposition(ctx, map[int]uint64{partition: uint64(offset) + 1})
}

// Replay moves every partition's consumer to from.
func (g *group) Replay(ctx context.Context, from engine.Start) error {
	if err := g.e.refuse("replay"); err != nil {
		return err
	}
	if err := from.Validate(); err != nil {
		return err
	}
	seqs, err := g.startSeqs(ctx, from)
	if err != nil {
		return err
	}
	m := make(map[int]uint64, len(seqs))
	for p, s := range seqs {
		m[p] = s
	}
	return g.reposition(ctx, m)
}

// reposition holds the partitions, waits until this broker's workers for
// them are neither delivering nor pulling, resets the consumers to the
// given sequences on the server, and lets the workers go on from there: a
// record a worker fetched before is dropped (the reset made it moot).
// When ctx ends before the workers are idle, nothing has moved.
func (g *group) reposition(ctx context.Context, seqs map[int]uint64) error {
	ps := make([]int, 0, len(seqs))
	for p := range seqs {
		ps = append(ps, p)
	}
	slices.Sort(ps)
	for _, p := range ps {
		g.slots[p].hold()
	}
	defer func() {
		for _, p := range ps {
			g.slots[p].unhold()
		}
	}()
	for _, p := range ps {
		if err := g.slots[p].waitIdle(ctx, true); err != nil {
			return fmt.Errorf("nothing moved: %w", err)
		}
	}
	for _, p := range ps {
		if _, err := g.t.streams[p].ResetConsumerToSequence(ctx, g.e.names.consumer(g.name, p), seqs[p]); err != nil {
			return g.e.ctxErr(ctx, fmt.Errorf("partition %d: %w", p, err))
		}
		g.slots[p].bumpEpoch(seqs[p])
	}
	return nil
}

// Committed is the offset partition reads next, from the consumer's ack
// floor on the server; -1 when the server cannot be asked.
func (g *group) Committed(partition int) int64 {
	if partition < 0 || partition >= g.t.parts {
		return 0
	}
	if s := g.snap.Load(); s != nil {
		return s.committed[partition]
	}
	ctx, cancel := g.e.ctx()
	defer cancel()
	info, err := g.consumers[partition].Info(ctx)
	if err != nil {
		return -1
	}
	return int64(info.AckFloor.Stream)
}

// Lag is the records the group has yet to commit, summed over
// partitions: from each stream's last sequence down to the consumer's ack
// floor, or to the oldest record retained when retention removed the ones
// between (the server's NumPending lags behind publishes).
func (g *group) Lag() int64 {
	if s := g.snap.Load(); s != nil {
		return s.lag
	}
	ctx, cancel := g.e.ctx()
	defer cancel()
	var lag int64
	for p, c := range g.consumers {
		sinfo, err := g.t.streams[p].Info(ctx)
		if err != nil {
			continue
		}
		info, err := c.Info(ctx)
		if err != nil {
			continue
		}
		from := max(info.AckFloor.Stream, sinfo.State.FirstSeq-min(sinfo.State.FirstSeq, 1))
		if sinfo.State.LastSeq > from {
			lag += int64(sinfo.State.LastSeq - from)
		}
	}
	return lag
}

// Stats counts what this broker's workers did; DeadLettersEvicted is the
// server's count for the group.
func (g *group) Stats() engine.GroupStats {
	st := engine.GroupStats{Delivered: g.delivered.Load(), Retried: g.retried.Load(), DeadLettered: g.deadLettered.Load(), Skipped: g.skipped.Load()}
	if s := g.snap.Load(); s != nil {
		st.DeadLettersEvicted = s.evicted
		return st
	}
	ctx, cancel := g.e.ctx()
	defer cancel()
	if info, err := g.dlq.Info(ctx); err == nil && info.State.FirstSeq > 0 {
		st.DeadLettersEvicted = int64(info.State.FirstSeq) - 1
	}
	return st
}

// stalled says why a group with lag cannot make progress: paused on the
// server, or without a live member anywhere; "" when it can.
func (g *group) stalled(ctx context.Context, info *natsjs.ConsumerInfo) string {
	if info.Paused {
		return "paused"
	}
	live, _, err := g.liveMembers(ctx)
	if err == nil && len(live) == 0 {
		return "without consumers"
	}
	return ""
}

// shutdown stops the loop and every worker, for Close: each finishes its
// delivery in flight. The channel closes when all have exited.
func (g *group) shutdown() <-chan struct{} {
	g.mu.Lock()
	g.closed = true
	stop, loopDone := g.loopStop, g.loopDone
	var done []<-chan struct{}
	for _, s := range g.slots {
		if w := s.worker; w != nil {
			w.signalStop()
			done = append(done, w.done)
		}
	}
	g.mu.Unlock()
	if stop != nil {
		close(stop)
		done = append(done, loopDone)
	}
	return waitAll(done)
}

// unfinished lists the partitions where the group has not committed
// everything, for Close's ShutdownError.
//
// A group that has live members in other brokers is not left behind: they
// go on with its partitions, so it has none here.
func (g *group) unfinished(ctx context.Context) []engine.Unfinished {
	if live, _, err := g.liveMembers(ctx); err == nil {
		g.mu.Lock()
		others := 0
		for _, name := range live {
			if g.members[name] == nil {
				others++
			}
		}
		g.mu.Unlock()
		if others > 0 {
			return nil
		}
	}
	var out []engine.Unfinished
	for p, c := range g.consumers {
		sinfo, err := g.t.streams[p].Info(ctx)
		if err != nil {
			continue
		}
		info, err := c.Info(ctx)
		if err != nil || settledTo(info, sinfo.State.LastSeq) {
			continue
		}
		out = append(out, engine.Unfinished{Group: g.name, Topic: g.t.name, Partition: p,
			Committed: int64(info.AckFloor.Stream), End: int64(sinfo.State.LastSeq), Running: g.slots[p].busyNow()})
	}
	return out
}

// leaveAll removes every local member, for Close: keys deleted, and
// onLeave called once the member's workers have exited (at once, unless a
// handler Close gave up on still runs).
func (g *group) leaveAll(ctx context.Context) {
	g.mu.Lock()
	ms := make([]*member, 0, len(g.members))
	done := map[*member][]<-chan struct{}{}
	for _, m := range g.members {
		m.left = true
		ms = append(ms, m)
	}
	for _, s := range g.slots {
		if w := s.worker; w != nil {
			done[w.m] = append(done[w.m], w.done)
		}
	}
	clear(g.members)
	g.mu.Unlock()
	for _, m := range ms {
		_ = g.e.kv.Delete(ctx, m.key)
		if m.onLeave == nil {
			continue
		}
		all := waitAll(done[m])
		select {
		case <-all:
			m.onLeave()
		default:
			go func() { // exits when the member's last worker has
				<-all
				m.onLeave()
			}()
		}
	}
}
