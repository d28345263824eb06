package jetstream

// Membership: a group's local members, their keys in the membership
// bucket, the assignment they follow, and the workers it starts and stops.
// Its loop (loop.go) heartbeats the keys and reconciles.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/logbus/logbus/engine"
	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
)

// member is a consumer of this broker in the group.
type member struct {
	name    string
	key     string
	h       engine.Handler      // nil for a batch consumer
	bh      engine.BatchHandler // a batch consumer's; nil otherwise
	batch   engine.BatchSpec    // a batch consumer's, resolved
	onLeave func()
	rev     uint64 // of its membership key
	left    bool
	evicted bool // its key expired and another broker took the name: it owns nothing
}

// live reports whether m may own partitions: its key is on the server and
// it has not left. The membership's mu must be held.
func (m *member) live() bool { return m.rev != 0 && !m.left && !m.evicted }

// membership is a group's local members and the assignment this broker
// follows. It starts a worker for each partition a live local member owns
// (the slot's worker field, which mu guards) and stops it when the
// partition moves. It reads only what never changes of its group, and
// calls on the group's other parts outside its lock.
type membership struct {
	g *group

	// recMu serialises reconcile, which Subscribe, Leave, the loop and
	// exiting workers all call.
	recMu sync.Mutex

	mu     sync.Mutex // guards the fields below and the slots' worker; never held across a server request or user code
	byName map[string]*member
	assign map[string][]int // the last assignment computed, of every live member
	order  []string         // its members, in the order they joined
	closed bool             // shutdown began
	health health           // of the membership, as the loop and beat see it
	loop   loop             // started by the first local member's join, stopped by shutdown
}

func newMembership(g *group) *membership {
	return &membership{g: g, byName: map[string]*member{}, loop: loop{g: g, wake: make(chan struct{}, 1)}}
}

// join adds a local member: its membership key, then a reconcile, so the
// assignment includes it when Subscribe returns.
func (ms *membership) join(ctx context.Context, m *member) error {
	g := ms.g
	consumer := m.name
	key := g.e.names.memberKey(g.t.name, g.name, consumer)
	m.key = key
	ms.mu.Lock()
	switch {
	case ms.closed:
		ms.mu.Unlock()
		return fmt.Errorf("subscribe %q to group %q: %w", consumer, g.name, engine.ErrClosed)
	case ms.byName[consumer] != nil:
		ms.mu.Unlock()
		return fmt.Errorf("consumer %q is already in group %q: %w", consumer, g.name, engine.ErrSubscription)
	}
	ms.byName[consumer] = m // reserved; not yet live
	ms.mu.Unlock()
	rev, err := ms.createKey(ctx, key)
	if err != nil {
		ms.mu.Lock()
		delete(ms.byName, consumer)
		ms.mu.Unlock()
		if errors.Is(err, natsjs.ErrKeyExists) {
			return fmt.Errorf("consumer %q is already in group %q (in another broker, or one that stopped less than a member TTL ago): %w",
				consumer, g.name, engine.ErrSubscription)
		}
		return g.e.ctxErr(ctx, fmt.Errorf("subscribe %q to group %q: %w", consumer, g.name, err))
	}
	ms.mu.Lock()
	m.rev = rev
	ms.loop.start()
	ms.mu.Unlock()
	_ = ms.reconcile()
	return nil
}

// createKey creates a member's key, waiting out a membership bucket
// without a leader: after a server of the cluster is lost, the bucket's
// replicas elect a new leader within 4-9s, and meanwhile nats.go says no
// stream responded. It tries again every 100ms until ctx ends, or for the
// request timeout when ctx has no deadline.
func (ms *membership) createKey(ctx context.Context, key string) (uint64, error) {
	e := ms.g.e
	ctx, cancel := e.bounded(ctx)
	defer cancel()
	for {
		rev, err := e.kv.Create(ctx, key, []byte(e.instance))
		if !errors.Is(err, natsjs.ErrNoStreamResponse) || ctx.Err() != nil {
			return rev, err
		}
		pause(ctx, 100*time.Millisecond)
	}
}

// isKnown reports whether key is a member the last reconcile saw.
func (ms *membership) isKnown(key string) bool {
	name := decodeName(strings.TrimPrefix(key, ms.g.e.names.memberPrefix(ms.g.t.name, ms.g.name)))
	ms.mu.Lock()
	defer ms.mu.Unlock()
	_, ok := ms.assign[name]
	return ok
}

// isClosed reports whether shutdown began.
func (ms *membership) isClosed() bool {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	return ms.closed
}

// heartbeat refreshes every local member's key. A key that expired (this
// process stalled past the TTL, or the bucket was made again) is created
// again; one another broker took meanwhile leaves that member without
// partitions. It reports whether a member's standing changed (the loop
// must reconcile) and the membership event to raise, if any.
func (ms *membership) heartbeat(ctx context.Context) (changed bool, ev *engine.Event) {
	e := ms.g.e
	type beat struct {
		m   *member
		rev uint64
	}
	ms.mu.Lock()
	beats := make([]beat, 0, len(ms.byName))
	for _, m := range ms.byName {
		if m.rev != 0 { // 0: still joining, its key being created
			beats = append(beats, beat{m, m.rev})
		}
	}
	ms.mu.Unlock()
	var failed error
	for _, b := range beats {
		m := b.m
		rev, err := e.kv.Update(ctx, m.key, []byte(e.instance), b.rev)
		recreated := false
		if err != nil {
			// Not after the member left: its key is gone because Leave or
			// Close deleted it, and must stay gone.
			if ms.hasLeft(m) {
				continue
			}
			rev, err = e.kv.Create(ctx, m.key, []byte(e.instance))
			recreated = err == nil
			if recreated && ms.hasLeft(m) { // it left meanwhile: take the key back
				_ = e.kv.Delete(ctx, m.key)
				continue
			}
		}
		ms.mu.Lock()
		switch {
		case err == nil:
			changed = changed || m.evicted || recreated
			m.rev, m.evicted = rev, false
		case errors.Is(err, natsjs.ErrKeyExists):
			changed = changed || !m.evicted
			m.evicted = true
		default:
			failed = fmt.Errorf("heartbeat of consumer %q: %w", m.name, err)
		}
		ms.mu.Unlock()
	}
	if len(beats) == 0 {
		return changed, nil
	}
	ev = ms.noteHealth(true, failed)
	return changed || ev != nil, ev
}

// hasLeft reports whether m has left the group (Leave, Close).
func (ms *membership) hasLeft(m *member) bool {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	return m.left
}

// health is how well this broker follows the group's membership on the
// server: the latest failure of a heartbeat and of a reconcile, each
// cleared by the next success of its kind, and when the failures began.
// Guarded by the membership's mu.
type health struct {
	beatErr, recErr error
	since           time.Time
}

func (h health) err() error {
	if h.recErr != nil {
		return h.recErr
	}
	return h.beatErr
}

// noteHealth records the outcome of a heartbeat (beat) or of a reconcile,
// and returns the EventMembership to raise when the group's membership
// went from followed to not, or back (nil otherwise, and when nothing
// observes).
func (ms *membership) noteHealth(beat bool, err error) *engine.Event {
	g := ms.g
	ms.mu.Lock()
	defer ms.mu.Unlock()
	was := ms.health.err()
	if beat {
		ms.health.beatErr = err
	} else {
		ms.health.recErr = err
	}
	now := ms.health.err()
	var ev *engine.Event
	switch {
	case was == nil && now != nil:
		ms.health.since = time.Now()
		ev = &engine.Event{Kind: engine.EventMembership, Topic: g.t.name, Group: g.name, Err: now}
	case was != nil && now == nil:
		ev = &engine.Event{Kind: engine.EventMembership, Topic: g.t.name, Group: g.name, Delay: time.Since(ms.health.since)}
		ms.health.since = time.Time{}
	}
	if g.e.obs == nil {
		return nil
	}
	return ev
}

// liveMembers lists the group's members across brokers, sorted: the keys
// of the membership bucket under the group's prefix whose last entry is a
// heartbeat (not a deletion), read with one request, a batched direct get
// of the last message of each key. (nats.go's ListKeys creates a consumer
// on the server for every listing and deletes it after, through the meta
// leader on a cluster; after a restart of the server one such listing was
// seen to take 5s, and one cut short by its context ends without an
// error, which would deal without the members it missed.) The answer
// comes from any replica of the bucket, so it may lag a moment behind its
// leader: a deal made from it is stored with compare-and-set, and the
// next reconcile corrects it.
func (ms *membership) liveMembers(ctx context.Context) ([]string, error) {
	e := ms.g.e
	prefix := e.names.memberPrefix(ms.g.t.name, ms.g.name)
	bucket := e.names.bucket()
	req, _ := json.Marshal(struct {
		MultiLast []string `json:"multi_last"`
	}{[]string{"$KV." + bucket + "." + prefix + "*"}})
	nc := e.js.Conn()
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return nil, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishRequest(apiPrefix(e.js)+"DIRECT.GET.KV_"+bucket, inbox, req); err != nil {
		return nil, err
	}
	var names []string
	for {
		msg, err := sub.NextMsgWithContext(ctx)
		if err != nil {
			return nil, err
		}
		switch status := msg.Header.Get("Status"); status {
		case "": // a key's last entry
		case "204": // the end of the batch
			slices.Sort(names)
			return names, nil
		case "404": // no key at all
			return nil, nil
		case "503":
			return nil, fmt.Errorf("membership bucket %s: %w", bucket, nats.ErrNoResponders)
		default:
			return nil, fmt.Errorf("membership bucket %s: status %s %s", bucket, status, msg.Header.Get("Description"))
		}
		if op := msg.Header.Get("KV-Operation"); op == "DEL" || op == "PURGE" {
			continue
		}
		key := strings.TrimPrefix(msg.Header.Get("Nats-Subject"), "$KV."+bucket+".")
		names = append(names, decodeName(strings.TrimPrefix(key, prefix)))
	}
}

// reconcile computes the assignment from the live membership and makes
// the local workers follow it: a worker whose partition moved is told to
// stop (it finishes its delivery in flight), and a partition this broker
// now owns gets a worker once the previous one has exited. When the
// server cannot be read it changes nothing, reports the failure (see
// noteHealth) and returns it.
func (ms *membership) reconcile() error {
	obs := ms.g.e.obs
	ev, err := ms.reconcileLocked()
	if ev != nil {
		obs.Observe(ev)
	}
	if hev := ms.noteHealth(false, err); hev != nil {
		obs.Observe(hev)
	}
	return err
}

// reconcileLocked is reconcile under recMu; it returns the rebalance
// event to raise once recMu is released (nil when nothing observes or
// the assignment did not change): an observer may Subscribe or Leave,
// which reconcile.
func (ms *membership) reconcileLocked() (*engine.Event, error) {
	g := ms.g
	ms.recMu.Lock()
	defer ms.recMu.Unlock()
	ctx, cancel := g.e.ctx()
	live, err := ms.liveMembers(ctx)
	var d deal
	if err == nil {
		d, err = currentDeal(ctx, g.e.deals, g.e.names.memberPrefix(g.t.name, g.name)+"deal", live, g.t.parts)
	}
	cancel()
	if err != nil {
		return nil, fmt.Errorf("group %q of topic %q: membership: %w", g.name, g.t.name, err)
	}
	assign := d.byMember()
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if ms.closed {
		return nil, nil
	}
	var ev *engine.Event
	if g.e.obs != nil && !maps.EqualFunc(ms.assign, assign, slices.Equal) {
		ev = &engine.Event{Kind: engine.EventRebalance, Topic: g.t.name, Group: g.name,
			Before: cloneAssign(ms.assign), After: cloneAssign(assign)}
	}
	ms.assign = assign
	ms.order = slices.Clone(d.Members)
	want := make([]*member, g.t.parts)
	for name, ps := range assign {
		if m := ms.byName[name]; m != nil && m.live() {
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
	return ev, nil
}

// cloneAssign copies an assignment, for an event: never nil.
func cloneAssign(a map[string][]int) map[string][]int {
	out := make(map[string][]int, len(a))
	for m, ps := range a {
		out[m] = slices.Clone(ps)
	}
	return out
}

// nextOwner says who owns w's partition next (assign.go's nextOwner), for
// a worker that stops holding a record: nobody once the group was
// deleted; while Close stops the workers, this broker (finished here, as a
// delivery in flight) unless Close already gave up.
func (ms *membership) nextOwner(w *worker) owner {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	switch {
	case ms.g.fate.gone():
		return ownerNone
	case ms.closed && ms.g.e.handlerCtx.Err() == nil:
		return ownerRemote
	case ms.closed:
		return ownerNone
	}
	return nextOwner(ms.assign, ms.byName, w.s.p, w.m)
}

// exited is called by a worker that stopped: the slot is free, and the
// partition is unpinned unless a local member owns it now.
func (ms *membership) exited(w *worker) {
	g, s := ms.g, w.s
	ms.mu.Lock()
	if s.worker == w {
		s.worker = nil
	}
	keep := !ms.closed && ownedLocally(ms.assign, ms.byName, s.p)
	var giveBack record
	var epoch uint64
	var window *keyState
	if !keep { // what was kept for the next local worker goes back to the server: there is none
		giveBack, epoch, window = s.takeKept()
	}
	ms.mu.Unlock()
	// Before the unpin, so that no other broker's pull is served while the
	// consumer is reset.
	if giveBack != nil {
		g.giveBack(s, epoch, giveBack)
	}
	if window != nil {
		g.giveBackWindow(s, window)
	}
	// Not while the connection is down: the unpin would wait out the
	// request timeout, and the worker's done with it (Leave and Close wait
	// for that); the pin lapses by itself after MemberTTL. Nor once the
	// group was deleted: there is nothing to unpin.
	if !keep && !w.crashed() && g.e.js.Conn().IsConnected() && !g.fate.gone() {
		ctx, cancel := g.e.ctx()
		_ = g.t.streams[s.p].UnpinConsumer(ctx, g.e.names.consumer(g.name, s.p), priorityGroup)
		if _, rp := s.pullers(); rp != nil { // this broker pulled redriven letters here: let the next owner's pulls in
			_ = g.redrive.rdq.UnpinConsumer(ctx, g.e.names.redriveConsumer(s.p), priorityGroup)
		}
		cancel()
	}
	ms.loop.poke()
}

// leave removes consumer: its key goes, its workers finish their delivery
// in flight and stop, and the partitions move to the remaining members.
// When ctx ends first it has left all the same; onLeave runs once the
// workers exited.
func (ms *membership) leave(ctx context.Context, consumer string) error {
	g := ms.g
	if err := g.e.refuse(fmt.Sprintf("leave group %q", g.name)); err != nil {
		return err
	}
	if err := g.fate.err(); err != nil {
		return err
	}
	ms.mu.Lock()
	m := ms.byName[consumer]
	if m == nil || m.left {
		ms.mu.Unlock()
		return fmt.Errorf("no consumer %q in group %q: %w", consumer, g.name, engine.ErrSubscription)
	}
	m.left = true
	delete(ms.byName, consumer)
	var done []<-chan struct{}
	for _, s := range g.slots {
		if w := s.worker; w != nil && w.m == m {
			w.signalStop()
			done = append(done, w.done)
		}
	}
	ms.mu.Unlock()
	rctx, cancel := g.e.ctx()
	_ = g.e.kv.Delete(rctx, m.key)
	cancel()
	_ = ms.reconcile()
	all := waitAll(done)
	select {
	case <-all:
		if m.onLeave != nil {
			m.onLeave()
		}
		return nil
	case <-ctx.Done():
		onLeaveAfter(m, all)
		return fmt.Errorf("leave group %q: consumer %q has left; its deliveries in flight go on: %w", g.name, consumer, ctx.Err())
	}
}

// onLeaveAfter runs m's onLeave once all closes, on a goroutine of its
// own.
func onLeaveAfter(m *member, all <-chan struct{}) {
	if m.onLeave == nil {
		return
	}
	go func() { // exits when the member's last worker has
		<-all
		m.onLeave()
	}()
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

// assignment returns a copy of the last assignment computed; empty once
// the group was deleted.
func (ms *membership) assignment() map[string][]int {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if ms.g.fate.gone() {
		return map[string][]int{}
	}
	return cloneAssign(ms.assign)
}

// shutdown stops the loop and every worker, for Close: each finishes its
// delivery in flight. The channel closes when all have exited.
func (ms *membership) shutdown() <-chan struct{} {
	g := ms.g
	ms.mu.Lock()
	ms.closed = true
	var done []<-chan struct{}
	type kept struct {
		s      *slot
		msg    record
		epoch  uint64
		window *keyState
	}
	var giveBack []kept
	for _, s := range g.slots {
		if w := s.worker; w != nil {
			w.signalStop()
			done = append(done, w.done)
			continue
		}
		// A record kept for a local worker that will not start now goes
		// back to the server (a stopping worker's exited does the same).
		if msg, epoch, window := s.takeKept(); msg != nil || window != nil {
			giveBack = append(giveBack, kept{s, msg, epoch, window})
		}
	}
	loop := ms.loop // its goroutines, as started under mu
	ms.mu.Unlock()
	for _, k := range giveBack {
		if k.msg != nil {
			g.giveBack(k.s, k.epoch, k.msg)
		}
		if k.window != nil {
			g.giveBackWindow(k.s, k.window)
		}
	}
	done = append(done, loop.stop()...)
	return waitAll(done)
}

// leaveAll removes every local member, for Close: keys deleted (within
// r, or without waiting for the server when r may not ask: see
// forgetMember), and onLeave called once the member's workers have exited
// (at once, unless a handler Close gave up on still runs).
func (ms *membership) leaveAll(r *reading) {
	g := ms.g
	ms.mu.Lock()
	members := make([]*member, 0, len(ms.byName))
	done := map[*member][]<-chan struct{}{}
	revs := map[*member]uint64{}
	for _, m := range ms.byName {
		m.left = true
		members = append(members, m)
		revs[m] = m.rev
	}
	for _, s := range g.slots {
		if w := s.worker; w != nil {
			done[w.m] = append(done[w.m], w.done)
		}
	}
	clear(ms.byName)
	ms.mu.Unlock()
	for _, m := range members {
		if rev := revs[m]; rev != 0 && r.ask() {
			r.got(g.e.kv.Delete(r.ctx, m.key, natsjs.LastRevision(rev)))
		} else if rev != 0 {
			ms.forgetMember(m.key, rev)
		}
		if m.onLeave == nil {
			continue
		}
		all := waitAll(done[m])
		select {
		case <-all:
			m.onLeave()
		default:
			onLeaveAfter(m, all)
		}
	}
}

// forgetMember deletes a member's key without waiting for the server,
// when Close may no longer wait: a delete marker published as the KV
// bucket's own Delete does, expecting the member's last revision so that
// a key another broker took meanwhile stays. Lost when the connection is
// down: the key then expires after MemberTTL.
func (ms *membership) forgetMember(key string, rev uint64) {
	e := ms.g.e
	if !e.connected() {
		return
	}
	subj := "$KV." + e.names.bucket() + "." + key
	if pre := apiPrefix(e.js); pre != natsjs.DefaultAPIPrefix {
		subj = pre + subj
	}
	msg := nats.NewMsg(subj)
	msg.Header.Set("KV-Operation", "DEL")
	msg.Header.Set(natsjs.ExpectedLastSubjSeqHeader, strconv.FormatUint(rev, 10))
	_ = e.js.Conn().PublishMsg(msg)
}

// carriedOn reports whether the group has live members in other brokers:
// from the membership bucket, within r, or as the last reconcile saw them
// when it cannot be asked.
func (ms *membership) carriedOn(r *reading) bool {
	var live []string
	asked := false
	if r.ask() {
		l, err := ms.liveMembers(r.ctx)
		if asked = r.got(err); asked {
			live = l
		}
	}
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if !asked {
		live = ms.order
	}
	return anyRemote(live, ms.byName)
}

// drainedByClose returns the partitions Close drains for the group: nil
// for every one, unless the group has live members in other brokers (as
// the last reconcile saw them), which carry on: then only those this
// broker's members own.
func (ms *membership) drainedByClose() map[int]bool {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if !anyRemote(ms.order, ms.byName) {
		return nil
	}
	return localPartitions(ms.assign, ms.byName)
}

// describe fills the snapshot's view of the membership: the members in
// join order, each partition's owner, the membership's health; and
// returns which partitions have a worker in this broker.
func (ms *membership) describe(gs *engine.GroupSnapshot) (running []bool) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	gs.Consumers = slices.Clone(ms.order)
	gs.MembershipErr, gs.MembershipErrSince = ms.health.err(), ms.health.since
	for name, ps := range ms.assign {
		for _, p := range ps {
			gs.Partitions[p].Owner = name
		}
	}
	running = make([]bool, len(ms.g.slots))
	for p, s := range ms.g.slots {
		running[p] = s.worker != nil
	}
	return running
}
