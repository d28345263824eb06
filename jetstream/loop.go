package jetstream

// The loop keeps a group's membership (membership.go) current in this
// broker, on two goroutines of its own: run reconciles, beat heartbeats.
// The first local member's join starts them; shutdown stops them.

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
)

// loop is a group's loop and heartbeat goroutines, and how to reach them.
type loop struct {
	g    *group
	wake chan struct{} // buffered 1: run reconciles soon

	// Set by start, under the membership's mu; never changed after.
	cancel         context.CancelFunc // stops run and beat; nil until started
	done, beatDone chan struct{}      // closed when run, and beat, have exited
}

// start starts the goroutines unless they run. The membership's mu must
// be held.
func (l *loop) start() {
	if l.cancel != nil {
		return
	}
	var ctx context.Context
	ctx, l.cancel = context.WithCancel(context.Background())
	l.done, l.beatDone = make(chan struct{}), make(chan struct{})
	go l.run(ctx, l.done)      // exits when shutdown calls stop
	go l.beat(ctx, l.beatDone) // exits when shutdown calls stop
}

// stop stops the goroutines, if they were started, without waiting: the
// channels returned close once they have exited. Idempotent: Close and a
// deletion may both stop the group.
func (l loop) stop() []<-chan struct{} {
	if l.cancel == nil {
		return nil
	}
	l.cancel()
	return []<-chan struct{}{l.done, l.beatDone}
}

// poke wakes run for a reconcile soon.
func (l *loop) poke() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// run reconciles the assignment with the live membership: whenever a
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
func (l *loop) run(ctx context.Context, done chan struct{}) {
	defer close(done)
	g := l.g
	prefix := g.e.names.memberPrefix(g.t.name, g.name)
	var members, deals watch
	defer members.stop()
	defer deals.stop()
	watchAll := func() {
		l.startWatch(ctx, &members, func(ctx context.Context) (natsjs.KeyWatcher, error) {
			return g.e.kv.WatchFiltered(ctx, []string{prefix + "*"}, natsjs.UpdatesOnly(), natsjs.MetaOnly())
		})
		l.startWatch(ctx, &deals, func(ctx context.Context) (natsjs.KeyWatcher, error) {
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
		case <-l.wake:
			if g.fate.suspect.Swap(false) && g.fate.onServer() {
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
			if e != nil && e.Operation() == natsjs.KeyValuePut && g.members.isKnown(e.Key()) {
				continue // a heartbeat: nothing changed
			}
		case e, ok := <-deals.ch:
			if !ok {
				deals.stop()
			}
			if e != nil && e.Operation() != natsjs.KeyValuePut && g.fate.onServer() {
				return // deleted, maybe by another broker (lifecycle.go)
			}
		case <-tick.C:
			g.pause.follow()
			g.redrive.poll()
			watchAll()
		}
		if err := g.members.reconcile(); err != nil && g.e.ensureBuckets() {
			// The buckets were made again: the watches follow the old ones.
			members.stop()
			deals.stop()
			watchAll()
			_ = g.members.reconcile()
		}
	}
}

// watch is one of run's KV watches; ch is nil while it does not run (not
// started yet, or its consumer was lost), and a nil channel is never ready
// in run's select.
type watch struct {
	ch     <-chan natsjs.KeyValueEntry
	cancel context.CancelFunc
}

// startWatch starts w unless it runs, with open, bounded by MemberTTL/3:
// nats.go's watch lives as long as the context it was opened with, so
// that context has no deadline, and a timer cancels it instead when the
// opening takes too long (a server that does not answer). A failure
// leaves w stopped, for the next tick.
func (l *loop) startWatch(ctx context.Context, w *watch, open func(context.Context) (natsjs.KeyWatcher, error)) {
	if w.ch != nil {
		return
	}
	wctx, cancel := context.WithCancel(ctx)
	var opened atomic.Bool
	t := time.AfterFunc(l.g.e.cfg.memberTTL/3, func() {
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
// a goroutine of its own: a heartbeat must never wait behind run's
// requests. (When it did, one request to a server that had lost a node
// took the 5s request timeout, as long as the member TTL, and the
// members' keys expired: their partitions went to other brokers and came
// back, though this broker was alive.) Each beat is bounded by
// MemberTTL/3, so a slow one delays the next by at most that. A beat that
// changes what run must act on wakes it.
func (l *loop) beat(ctx context.Context, done chan struct{}) {
	defer close(done)
	g := l.g
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
		changed, ev := g.members.heartbeat(bctx)
		cancel()
		if ev != nil {
			g.e.obs.Observe(ev)
		}
		if changed {
			l.poke()
		}
	}
}
