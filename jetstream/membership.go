package jetstream

// Membership: a group's local members, their keys in the membership
// bucket, the loop that heartbeats them and follows the assignment, and
// the workers it starts and stops.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/logbus/logbus/engine"
	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
)

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

// join adds a local member: its membership key, then a reconcile, so the
// assignment includes it when Subscribe returns.
func (g *group) join(ctx context.Context, m *member) error {
	consumer := m.name
	key := g.e.names.memberKey(g.t.name, g.name, consumer)
	m.key = key
	g.mu.Lock()
	switch {
	case g.closed:
		g.mu.Unlock()
		return fmt.Errorf("subscribe %q to group %q: %w", consumer, g.name, engine.ErrClosed)
	case g.members[consumer] != nil:
		g.mu.Unlock()
		return fmt.Errorf("consumer %q is already in group %q: %w", consumer, g.name, engine.ErrSubscription)
	}
	g.members[consumer] = m // reserved; not yet live
	g.mu.Unlock()
	rev, err := g.createKey(ctx, key)
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
	if g.stopLoop == nil {
		var ctx context.Context
		ctx, g.stopLoop = context.WithCancel(context.Background())
		g.loopDone, g.beatDone = make(chan struct{}), make(chan struct{})
		go g.loop(ctx, g.loopDone) // exits when shutdown calls stopLoop
		go g.beat(ctx, g.beatDone) // exits when shutdown calls stopLoop
	}
	g.mu.Unlock()
	_ = g.reconcile()
	return nil
}

// createKey creates a member's key, waiting out a membership bucket
// without a leader: after a server of the cluster is lost, the bucket's
// replicas elect a new leader within 4-9s, and meanwhile nats.go says no
// stream responded. It tries again every 100ms until ctx ends, or for the
// request timeout when ctx has no deadline.
func (g *group) createKey(ctx context.Context, key string) (uint64, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, g.e.cfg.requestTimeout)
		defer cancel()
	}
	for {
		rev, err := g.e.kv.Create(ctx, key, []byte(g.e.instance))
		if !errors.Is(err, natsjs.ErrNoStreamResponse) || ctx.Err() != nil {
			return rev, err
		}
		pause(ctx, 100*time.Millisecond)
	}
}

// loop reconciles the assignment with the live membership: whenever a
// membership key or the group's deal changes on the server (watched),
// whenever woken (a heartbeat that changed something, a worker that
// exited), and every MemberTTL/3 (which also catches keys that expired:
// an expiry sends no event), until ctx ends. Its requests may wait up to
// the request timeout on a server in trouble; heartbeats do not wait for
// them (beat).
//
// It repairs what a restart or the loss of a server takes away: a watch
// whose consumer is gone is started again on the next tick (meanwhile
// the ticks reconcile), and when a reconcile fails it makes the
// membership and assignment buckets again if they are missing (memory
// storage across a restart of the server, or a deletion).
func (g *group) loop(ctx context.Context, done chan struct{}) {
	defer close(done)
	prefix := g.e.names.memberPrefix(g.t.name, g.name)
	var members, deals watch
	defer members.stop()
	defer deals.stop()
	watchAll := func() {
		g.startWatch(ctx, &members, func(ctx context.Context) (natsjs.KeyWatcher, error) {
			return g.e.kv.WatchFiltered(ctx, []string{prefix + "*"}, natsjs.UpdatesOnly(), natsjs.MetaOnly())
		})
		g.startWatch(ctx, &deals, func(ctx context.Context) (natsjs.KeyWatcher, error) {
			return g.e.deals.Watch(ctx, prefix+"deal", natsjs.UpdatesOnly(), natsjs.MetaOnly())
		})
	}
	watchAll()
	// A Redrive in any broker announces itself (redrive.go): the local
	// workers then look at their redrive consumers before their next pull.
	wakes := make(chan *nats.Msg, 16)
	if sub, err := g.e.js.Conn().ChanSubscribe(g.e.names.redriveWake(g.t.name, g.name), wakes); err == nil {
		defer func() { _ = sub.Unsubscribe() }()
	}
	tick := time.NewTicker(g.e.cfg.memberTTL / 3)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-g.wake:
			if g.suspectGone.Swap(false) && g.goneOnServer() {
				return // deleted, maybe by another broker (lifecycle.go)
			}
		case <-wakes:
			for _, s := range g.slots {
				s.wantRedrive()
			}
			continue
		case e, ok := <-members.ch:
			if !ok {
				members.stop()
				continue
			}
			if e != nil && e.Operation() == natsjs.KeyValuePut && g.isKnown(e.Key()) {
				continue // a heartbeat: nothing changed
			}
		case e, ok := <-deals.ch:
			if !ok {
				deals.stop()
			}
			if e != nil && e.Operation() != natsjs.KeyValuePut && g.goneOnServer() {
				return // deleted, maybe by another broker (lifecycle.go)
			}
		case <-tick.C:
			g.followResume()
			g.pollRedrive()
			watchAll()
		}
		if err := g.reconcile(); err != nil && g.e.ensureBuckets() {
			// The buckets were made again: the watches follow the old ones.
			members.stop()
			deals.stop()
			watchAll()
			_ = g.reconcile()
		}
	}
}

// watch is one of the loop's KV watches; ch is nil while it does not run
// (not started yet, or its consumer was lost), and a nil channel is never
// ready in the loop's select.
type watch struct {
	ch     <-chan natsjs.KeyValueEntry
	cancel context.CancelFunc
}

// startWatch starts w unless it runs, with open, bounded by MemberTTL/3:
// nats.go's watch lives as long as the context it was opened with, so
// that context has no deadline, and a timer cancels it instead when the
// opening takes too long (a server that does not answer). A failure
// leaves w stopped, for the next tick.
func (g *group) startWatch(ctx context.Context, w *watch, open func(context.Context) (natsjs.KeyWatcher, error)) {
	if w.ch != nil {
		return
	}
	wctx, cancel := context.WithCancel(ctx)
	var opened atomic.Bool
	t := time.AfterFunc(g.e.cfg.memberTTL/3, func() {
		if !opened.Load() {
			cancel()
		}
	})
	kw, err := open(wctx)
	opened.Store(true)
	t.Stop()
	if err != nil {
		cancel()
		return
	}
	*w = watch{ch: kw.Updates(), cancel: cancel}
}

// stop stops w if it runs, without waiting: cancelling the watch's
// context makes nats.go unsubscribe and delete its consumer on a
// goroutine of its own, which ends when the server answered or after
// nats.go's request timeout (KeyWatcher.Stop would wait for that here,
// up to 5s with the server away).
func (w *watch) stop() {
	if w.cancel != nil {
		w.cancel()
	}
	*w = watch{}
}

// beat heartbeats the local members every MemberTTL/3 until ctx ends, on
// a goroutine of its own: a heartbeat must never wait behind the loop's
// requests. (When it did, one request to a server that had lost a node
// took the 5s request timeout, as long as the member TTL, and the
// members' keys expired: their partitions went to other brokers and came
// back, though this broker was alive.) Each beat is bounded by
// MemberTTL/3, so a slow one delays the next by at most that. A beat that
// changes what the loop must act on wakes it.
func (g *group) beat(ctx context.Context, done chan struct{}) {
	defer close(done)
	every := g.e.cfg.memberTTL / 3
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		bctx, cancel := context.WithTimeout(ctx, every)
		changed, ev := g.heartbeat(bctx)
		cancel()
		if ev != nil {
			g.e.obs.Observe(ev)
		}
		if changed {
			g.poke()
		}
	}
}

// poke wakes the loop for a reconcile soon.
func (g *group) poke() {
	select {
	case g.wake <- struct{}{}:
	default:
	}
}

// isKnown reports whether key is a member the last reconcile saw.
func (g *group) isKnown(key string) bool {
	name := decodeName(strings.TrimPrefix(key, g.e.names.memberPrefix(g.t.name, g.name)))
	g.mu.Lock()
	defer g.mu.Unlock()
	_, ok := g.assign[name]
	return ok
}

// heartbeat refreshes every local member's key. A key that expired (this
// process stalled past the TTL, or the bucket was made again) is created
// again; one another broker took meanwhile leaves that member without
// partitions. It reports whether a member's standing changed (the loop
// must reconcile) and the membership event to raise, if any.
func (g *group) heartbeat(ctx context.Context) (changed bool, ev *engine.Event) {
	type beat struct {
		m   *member
		rev uint64
	}
	g.mu.Lock()
	ms := make([]beat, 0, len(g.members))
	for _, m := range g.members {
		if m.rev != 0 { // 0: still joining, its key being created
			ms = append(ms, beat{m, m.rev})
		}
	}
	g.mu.Unlock()
	var failed error
	for _, b := range ms {
		m := b.m
		rev, err := g.e.kv.Update(ctx, m.key, []byte(g.e.instance), b.rev)
		recreated := false
		if err != nil {
			// Not after the member left: its key is gone because Leave or
			// Close deleted it, and must stay gone.
			if g.hasLeft(m) {
				continue
			}
			rev, err = g.e.kv.Create(ctx, m.key, []byte(g.e.instance))
			recreated = err == nil
			if recreated && g.hasLeft(m) { // it left meanwhile: take the key back
				_ = g.e.kv.Delete(ctx, m.key)
				continue
			}
		}
		g.mu.Lock()
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
		g.mu.Unlock()
	}
	if len(ms) == 0 {
		return changed, nil
	}
	ev = g.noteHealth(true, failed)
	return changed || ev != nil, ev
}

// hasLeft reports whether m has left the group (Leave, Close).
func (g *group) hasLeft(m *member) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return m.left
}

// health is how well this broker follows the group's membership on the
// server: the latest failure of a heartbeat and of a reconcile, each
// cleared by the next success of its kind, and when the failures began.
// Guarded by the group's mu.
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
func (g *group) noteHealth(beat bool, err error) *engine.Event {
	g.mu.Lock()
	defer g.mu.Unlock()
	was := g.health.err()
	if beat {
		g.health.beatErr = err
	} else {
		g.health.recErr = err
	}
	now := g.health.err()
	var ev *engine.Event
	switch {
	case was == nil && now != nil:
		g.health.since = time.Now()
		ev = &engine.Event{Kind: engine.EventMembership, Topic: g.t.name, Group: g.name, Err: now}
	case was != nil && now == nil:
		ev = &engine.Event{Kind: engine.EventMembership, Topic: g.t.name, Group: g.name, Delay: time.Since(g.health.since)}
		g.health.since = time.Time{}
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
func (g *group) liveMembers(ctx context.Context) ([]string, error) {
	prefix := g.e.names.memberPrefix(g.t.name, g.name)
	bucket := g.e.names.bucket()
	req, _ := json.Marshal(struct {
		MultiLast []string `json:"multi_last"`
	}{[]string{"$KV." + bucket + "." + prefix + "*"}})
	nc := g.e.js.Conn()
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return nil, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishRequest(g.e.apiPrefix()+"DIRECT.GET.KV_"+bucket, inbox, req); err != nil {
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
func (g *group) reconcile() error {
	ev, err := g.reconcileLocked()
	if ev != nil {
		g.e.obs.Observe(ev)
	}
	if hev := g.noteHealth(false, err); hev != nil {
		g.e.obs.Observe(hev)
	}
	return err
}

// reconcileLocked is reconcile under recMu; it returns the rebalance
// event to raise once recMu is released (nil when nothing observes or
// the assignment did not change): an observer may Subscribe or Leave,
// which reconcile.
func (g *group) reconcileLocked() (*engine.Event, error) {
	g.recMu.Lock()
	defer g.recMu.Unlock()
	ctx, cancel := g.e.ctx()
	live, err := g.liveMembers(ctx)
	var d deal
	if err == nil {
		d, err = g.currentDeal(ctx, live)
	}
	cancel()
	if err != nil {
		return nil, fmt.Errorf("group %q of topic %q: membership: %w", g.name, g.t.name, err)
	}
	assign := d.byMember()
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return nil, nil
	}
	var ev *engine.Event
	if g.e.obs != nil && !maps.EqualFunc(g.assign, assign, slices.Equal) {
		ev = &engine.Event{Kind: engine.EventRebalance, Topic: g.t.name, Group: g.name,
			Before: cloneAssign(g.assign), After: cloneAssign(assign)}
	}
	g.assign = assign
	g.order = slices.Clone(d.Members)
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

// exited is called by a worker that stopped: the slot is free, and the
// partition is unpinned unless a local member owns it now.
func (g *group) exited(w *worker) {
	g.mu.Lock()
	if w.s.worker == w {
		w.s.worker = nil
	}
	keep := false // a live member of this broker owns the partition
	for name, ps := range g.assign {
		if m := g.members[name]; m != nil && g.live(m) && slices.Contains(ps, w.s.p) && !g.closed {
			keep = true
		}
	}
	var giveBack record
	var epoch uint64
	if !keep { // a record kept for the next local worker goes back to the server: there is none
		w.s.mu.Lock()
		giveBack, epoch, w.s.pending = w.s.pending, w.s.pendingEpoch, nil
		w.s.mu.Unlock()
	}
	g.mu.Unlock()
	if giveBack != nil {
		// Before the unpin, so that no other broker's pull is served
		// while the consumer is reset.
		g.giveBack(w.s, epoch, giveBack)
	}
	// Not while the connection is down: the unpin would wait out the
	// request timeout, and the worker's done with it (Leave and Close wait
	// for that); the pin lapses by itself after MemberTTL. Nor once the
	// group was deleted: there is nothing to unpin.
	if !keep && !w.crashed() && g.e.js.Conn().IsConnected() && g.gone.Load() == nil {
		ctx, cancel := g.e.ctx()
		_ = g.t.streams[w.s.p].UnpinConsumer(ctx, g.e.names.consumer(g.name, w.s.p), priorityGroup)
		w.s.mu.Lock()
		rp := w.s.rpuller
		w.s.mu.Unlock()
		if rp != nil { // this broker pulled redriven letters here: let the next owner's pulls in
			_ = g.rdq.UnpinConsumer(ctx, g.e.names.redriveConsumer(w.s.p), priorityGroup)
		}
		cancel()
	}
	g.poke()
}

// Leave removes consumer: its key goes, its workers finish their delivery
// in flight and stop, and the partitions move to the remaining members.
// When ctx ends first it has left all the same; onLeave runs once the
// workers exited.
func (g *group) Leave(ctx context.Context, consumer string) error {
	if err := g.e.refuse(fmt.Sprintf("leave group %q", g.name)); err != nil {
		return err
	}
	if err := g.refuseGone(); err != nil {
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
	_ = g.reconcile()
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
// of the group in every broker (refreshed on every tick of the loop);
// empty once the group was deleted.
func (g *group) Assignment() map[string][]int {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.gone.Load() != nil {
		return map[string][]int{}
	}
	out := make(map[string][]int, len(g.assign))
	for m, ps := range g.assign {
		out[m] = slices.Clone(ps)
	}
	return out
}

// shutdown stops the loop and every worker, for Close: each finishes its
// delivery in flight. The channel closes when all have exited.
func (g *group) shutdown() <-chan struct{} {
	g.mu.Lock()
	g.closed = true
	stop, loopDone, beatDone := g.stopLoop, g.loopDone, g.beatDone
	var done []<-chan struct{}
	type kept struct {
		s     *slot
		msg   record
		epoch uint64
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
		s.mu.Lock()
		if s.pending != nil {
			giveBack = append(giveBack, kept{s, s.pending, s.pendingEpoch})
			s.pending = nil
		}
		s.mu.Unlock()
	}
	g.mu.Unlock()
	for _, k := range giveBack {
		g.giveBack(k.s, k.epoch, k.msg)
	}
	if stop != nil {
		stop() // idempotent: Close and a deletion may both stop the group
		done = append(done, loopDone, beatDone)
	}
	return waitAll(done)
}

// leaveAll removes every local member, for Close: keys deleted (within
// r, or without waiting for the server when r may not ask: see
// forgetMember), and onLeave called once the member's workers have exited
// (at once, unless a handler Close gave up on still runs).
func (g *group) leaveAll(r *reading) {
	g.mu.Lock()
	ms := make([]*member, 0, len(g.members))
	done := map[*member][]<-chan struct{}{}
	revs := map[*member]uint64{}
	for _, m := range g.members {
		m.left = true
		ms = append(ms, m)
		revs[m] = m.rev
	}
	for _, s := range g.slots {
		if w := s.worker; w != nil {
			done[w.m] = append(done[w.m], w.done)
		}
	}
	clear(g.members)
	g.mu.Unlock()
	for _, m := range ms {
		if rev := revs[m]; rev != 0 && r.ask() {
			r.got(g.e.kv.Delete(r.ctx, m.key, natsjs.LastRevision(rev)))
		} else if rev != 0 {
			g.forgetMember(m.key, rev)
		}
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

// forgetMember deletes a member's key without waiting for the server,
// when Close may no longer wait: a delete marker published as the KV
// bucket's own Delete does, expecting the member's last revision so that
// a key another broker took meanwhile stays. Lost when the connection is
// down: the key then expires after MemberTTL.
func (g *group) forgetMember(key string, rev uint64) {
	if !g.e.connected() {
		return
	}
	subj := "$KV." + g.e.names.bucket() + "." + key
	if pre := apiPrefix(g.e.js); pre != natsjs.DefaultAPIPrefix {
		subj = pre + subj
	}
	msg := nats.NewMsg(subj)
	msg.Header.Set("KV-Operation", "DEL")
	msg.Header.Set(natsjs.ExpectedLastSubjSeqHeader, strconv.FormatUint(rev, 10))
	_ = g.e.js.Conn().PublishMsg(msg)
}

// closePullers ends the partitions' pull subscriptions, for Close, once
// the workers stopped (or Close gave up on them: their pulls then end at
// once).
func (g *group) closePullers() {
	for _, s := range g.slots {
		s.mu.Lock()
		p, rp := s.puller, s.rpuller
		s.mu.Unlock()
		if p != nil {
			p.close()
		}
		if rp != nil {
			rp.close()
		}
	}
}
