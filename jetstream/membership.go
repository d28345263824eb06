package jetstream

// Membership: a group's local members, their keys in the membership
// bucket, the loop that heartbeats them and follows the assignment, and
// the workers it starts and stops.

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/logbus/logbus/internal/engine"
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
	// A Redrive in any broker announces itself (redrive.go): the local
	// workers then look at their redrive consumers before their next pull.
	wakes := make(chan *nats.Msg, 16)
	if sub, err := g.e.js.Conn().ChanSubscribe(g.e.names.redriveWake(g.t.name, g.name), wakes); err == nil {
		defer func() { _ = sub.Unsubscribe() }()
	}
	beatEvery := g.e.cfg.memberTTL / 3
	tick := time.NewTicker(beatEvery)
	defer tick.Stop()
	for {
		select {
		case <-stop:
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
		case e, ok := <-members:
			if !ok {
				members = nil
				continue
			}
			if e != nil && e.Operation() == natsjs.KeyValuePut && g.isKnown(e.Key()) {
				continue // a heartbeat: nothing changed
			}
		case e, ok := <-deals:
			if !ok {
				deals = nil
			}
			if e != nil && e.Operation() != natsjs.KeyValuePut && g.goneOnServer() {
				return // deleted, maybe by another broker (lifecycle.go)
			}
		case <-tick.C:
			// Heartbeats, and the reconcile that notices keys that expired
			// (an expiry sends no event): a crashed member's partitions
			// move within MemberTTL and a third.
			g.heartbeat()
			g.followResume()
			g.pollRedrive()
		}
		g.reconcile()
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
	if err := ctx.Err(); err != nil {
		// The lister stops when ctx ends, and then lists what it had:
		// not every member (Drain would take a group for memberless).
		return nil, nil, err
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
	if ev := g.reconcileLocked(); ev != nil {
		g.e.obs.Observe(ev)
	}
}

// reconcileLocked is reconcile under recMu; it returns the rebalance
// event to raise once recMu is released (nil when nothing observes or
// the assignment did not change): an observer may Subscribe or Leave,
// which reconcile.
func (g *group) reconcileLocked() *engine.Event {
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
		return nil
	}
	assign := d.byMember()
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return nil
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
	return ev
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
	again := g.closed // Close and a deletion may both stop the group
	g.closed = true
	stop, loopDone := g.loopStop, g.loopDone
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
		if !again {
			close(stop)
		}
		done = append(done, loopDone)
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
