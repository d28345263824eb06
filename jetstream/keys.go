package jetstream

// The worker's loop for a group with key concurrency n > 1
// (GroupSpec.KeyConcurrency). It keeps the per-record loop's rules (one
// worker per partition of a group in this broker; a record committed only
// once it settled; retries, dead letters, panics and decode failures
// judged by kit.Judge; the slot's holds for Pause, Seek and Replay) and
// changes how many records are unacked at once:
//
//   - The partition's consumer allows engine.KeyWindowSize(n) records
//     unacked (MaxAckPending), not n: a record waiting behind an earlier
//     record of its key, or waiting out its backoff, is unacked too, and
//     with n of them one busy key would stall every other. The window
//     (kit.KeyWindow) bounds what the worker reads instead: its pulls ask
//     for no more records than the window has Room for, so the records
//     between the server's ack floor and the last one read are never more
//     than the window size.
//   - Each record is acked on its own, as it settles (DoubleAck). The
//     server's ack floor is the contiguous commit: it stays below the
//     oldest unsettled record, whatever was acked after it.
//   - A failed attempt waits out its backoff here, kept alive on the
//     server (an in-progress ack every AckWait/3), its key held in the
//     window, and is retried with Attempt+1: a NakWithDelay would leave
//     the record's return to the server, to be taken by whatever pull is
//     open then, past the window's bound.
//   - A handler runs on a goroutine of the worker's, which settles its
//     outcome on the server (ack, dead letter) and reports it; the worker
//     alone touches the window.
//
// A stopping worker (a rebalance, Leave, Close) starts nothing more and
// waits for its deliveries in flight and their outcomes. When a member of
// this broker owns the partition next, its worker goes on with the window
// (slot.keyKept, adopt); else the records read and not settled are given
// back (giveBackWindow), in stream order: the server delivers those
// first, in that order, to the partition's next owner, whose window starts
// at the first of them and passes over the offsets settled in between. A
// Seek or a Replay (a reset of the consumer) discards the window.

import (
	"cmp"
	"slices"
	"time"

	"github.com/logbus/logbus/engine"
	"github.com/logbus/logbus/internal/kit"
	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
)

// keyRun is a worker's loop with key concurrency; only the worker's
// goroutine uses it, but for the results its handler goroutines send.
type keyRun struct {
	w *worker
	g *group
	s *slot
	n int

	p     *puller
	epoch uint64         // the slot's epoch the window belongs to
	win   *kit.KeyWindow // nil until the first record after a start or a reset
	recs  map[int64]*keyRec
	over  []record  // records read past the window's room (a lost pull's late answer), added as it frees
	late  []*keyRec // records delivered again below the window's start: each runs alone

	// seen is the last stream sequence the server had delivered when the
	// worker started: offsets passed over up to it were read (and
	// settled) by a previous owner, those past it dropped by retention
	// unread (skipped).
	seen uint64

	running  int  // handler goroutines not yet reported
	gaveBack bool // a record of the window went back to the server unsettled: the window cannot be left to another worker
	results  chan keyResult

	asked    int         // records the open pull may still bring; 0 when none is open
	pullT    *time.Timer // the open pull's bound, or the pause after a failed pull
	pullIdle bool        // pullT is the pause after a failed pull: no pull until it fires

	due    *time.Timer // the earliest backoff's end
	starts uint64      // for the stuck watchdog: bumped when the record holding the window changes
	shown  struct {
		oldest  int64
		attempt int
	}
}

// keyState is the window a stopping worker leaves to the partition's
// next local worker (slot.keyKept), which goes on with it: the records
// it read and did not settle stay where they are, unacked and unchanged
// on the server.
type keyState struct {
	epoch uint64
	win   *kit.KeyWindow
	recs  map[int64]*keyRec
	over  []record
	late  []*keyRec
}

// keyRec is a record of the window the worker holds.
type keyRec struct {
	msg     record
	md      *natsjs.MsgMetadata
	rec     *engine.Record
	derr    error // the record could not be decoded
	off     int64
	attempt int       // of its last attempt; 0 before the first here
	local   int       // attempts the server did not count (retried here)
	until   time.Time // the end of its backoff, while it waits one
	noCount bool      // its wait is a give-back's (ErrNotDelivered): the next attempt counts no more
}

// keyResult is how a delivery ended, as its handler goroutine settled it.
type keyResult struct {
	r       *keyRec
	verdict kit.Verdict
	herr    error
	gone    bool // not to be held any more: Close gave up on it, or it was given back to the server
}

func newKeyRun(w *worker) *keyRun {
	n := w.g.spec.KeyConcurrency
	return &keyRun{w: w, g: w.g, s: w.s, n: n, recs: make(map[int64]*keyRec),
		results: make(chan keyResult, n+1)}
}

// run is the loop: read records into the window while it has room, start
// what it lets start while the slot is not held, settle what ends; until
// stopped, then hand over.
func (k *keyRun) run() {
	g, s, w := k.g, k.s, k.w
	_ = g.pause.setMaxAckPending(s.p, engine.KeyWindowSize(k.n))
	ctx, cancel := g.e.ctx()
	if info, err := g.consumers[s.p].Info(ctx); err == nil {
		k.seen = info.Delivered.Stream
	}
	cancel()
	p, err := w.puller()
	for err != nil {
		g.pullFailed(err)
		if !w.pause(g.e.cfg.pollWait) {
			return
		}
		p, err = w.puller()
	}
	k.p = p
	s.mu.Lock()
	s.keyed = true
	k.starts = s.starts // the watchdog's word goes on from the last worker's
	k.epoch = s.epoch
	kept := s.keyKept
	s.keyKept = nil
	s.mu.Unlock()
	if kept != nil {
		k.adopt(kept)
	}
	keep := time.NewTicker(g.e.cfg.ackWait / 3)
	defer keep.Stop()
	k.pullT = time.NewTimer(time.Hour)
	k.pullT.Stop()
	k.due = time.NewTimer(time.Hour)
	k.due.Stop()
	defer k.pullT.Stop()
	defer k.due.Stop()
	defer k.handOver()
	for {
		s.mu.Lock()
		held, epoch, changed := s.holds > 0, s.epoch, s.changed
		redrive := s.wantsRedrive() || isRedriven(s.pending)
		s.mu.Unlock()
		if epoch != k.epoch {
			k.reset(epoch)
		}
		stopping := w.stopping()
		abandon := g.e.handlerCtx.Err() != nil
		if stopping && k.running == 0 && (k.asked == 0 || abandon) {
			return
		}
		if !held && !stopping {
			k.admit()
			k.start()
			if redrive {
				if k.idle() {
					k.show()
					w.redriveStep()
					continue
				}
			} else {
				k.pull()
			}
		}
		k.show()
		stop, gaveUp := w.stop, g.e.handlerCtx.Done()
		if stopping {
			stop = nil // closed: it would always be ready
		}
		if abandon {
			gaveUp = nil
		}
		select {
		case m := <-k.p.in:
			k.arrive(m)
		case r := <-k.results:
			k.ended(r)
		case <-k.pullT.C:
			k.asked, k.pullIdle = 0, false // the pull's answer was lost, or the pause after a failure is over
		case <-k.due.C:
			k.retryDue()
		case <-keep.C:
			k.keepAlive()
		case <-changed:
		case <-stop:
		case <-gaveUp: // Close gave up: no more waiting for the open pull
		}
	}
}

// adopt goes on with the window the last local worker left (handOver):
// unless a reset discarded it since (its epoch), its records are this
// worker's to deliver, and one waiting out its backoff is retried at
// once, its attempts counted on.
func (k *keyRun) adopt(st *keyState) {
	if st.epoch != k.epoch {
		return
	}
	k.win, k.recs, k.over, k.late = st.win, st.recs, st.over, st.late
	if k.win == nil {
		return
	}
	for off := range k.recs {
		if k.win.Retrying(off) {
			k.win.Retry(off)
		}
	}
}

// idle reports whether the window holds nothing: a redriven letter may go
// first.
func (k *keyRun) idle() bool {
	return k.running == 0 && k.asked == 0 && len(k.recs) == 0 && len(k.over) == 0 && len(k.late) == 0
}

// reset discards the window: the consumer was reset (a Seek, a Replay),
// so what was read is moot on the server. Nothing runs: the reset waited
// for the slot to be idle.
func (k *keyRun) reset(epoch uint64) {
	k.epoch = epoch
	k.win = nil
	clear(k.recs)
	k.over, k.late = nil, nil
	k.due.Stop()
}

// pull opens a pull for as many records as the window has room for, when
// none is open.
func (k *keyRun) pull() {
	if k.asked > 0 || k.pullIdle || len(k.over) > 0 {
		return
	}
	room := engine.KeyWindowSize(k.n)
	if k.win != nil {
		room = k.win.Room()
	}
	// The answers must fit in the puller's buffer, with a status or two
	// (newPuller).
	if room = min(room, cap(k.p.in)-len(k.p.in)-pullerRoom/2); room <= 0 {
		return
	}
	wait := k.g.e.cfg.pollWait
	if err := k.p.pullN(room, wait, false); err != nil {
		k.pullFailed(err)
		return
	}
	k.asked = room
	k.pullT.Reset(wait + time.Second)
}

// pullFailed pauses pulling for a poll wait after a pull was refused.
func (k *keyRun) pullFailed(err error) {
	k.g.pullFailed(err)
	k.asked, k.pullIdle = 0, true
	k.pullT.Reset(k.g.e.cfg.pollWait)
}

// arrive takes one message of the open pull's answer.
func (k *keyRun) arrive(m *nats.Msg) {
	msg, end, err := k.p.answer(m)
	if msg == nil {
		if end {
			k.pullT.Stop()
			k.asked = 0
			if err != nil {
				k.pullFailed(err)
			}
		}
		return
	}
	if k.asked > 0 {
		if k.asked--; k.asked == 0 {
			k.pullT.Stop()
		}
	}
	k.over = append(k.over, msg)
	k.admit()
}

// admit adds the records read to the window, as far as it has room.
func (k *keyRun) admit() {
	for len(k.over) > 0 {
		msg := k.over[0]
		md, err := msg.Metadata()
		if err != nil {
			_ = msg.Nak()
			k.over = k.over[1:]
			continue
		}
		off := int64(md.Sequence.Stream) - 1
		if k.win == nil {
			k.win = kit.NewKeyWindow(k.n, off)
		}
		r := &keyRec{msg: msg, md: md, off: off, attempt: int(md.NumDelivered) - 1}
		if off < k.win.End() {
			k.over = k.over[1:]
			if old, ok := k.recs[off]; ok { // delivered again while held (a lost in-progress ack): the new delivery is the live one
				old.msg, old.md = msg, md
				continue
			}
			// Delivered again below the window: after AckWait, by a
			// member that crashed, or after a lost ack. It runs alone.
			k.decode(r)
			k.late = append(k.late, r)
			continue
		}
		if gap := int(off - k.win.End()); gap+1 > k.win.Room() {
			return // kept, alive, until the window has room
		}
		k.over = k.over[1:]
		skipped := int64(-1)
		for k.win.End() < off { // settled before this window read them (a previous owner's acks, retention)
			o := k.win.End()
			k.win.AddAbsent(nil, true)
			k.win.Pass(o)
			if skipped < 0 && uint64(o) >= k.seen { // stream sequence o+1, past what the server had delivered
				skipped = o
			}
		}
		if skipped >= 0 {
			k.skipped(skipped, off)
		}
		k.decode(r)
		k.win.Add(r.rec.Key, r.rec.Key == nil)
		k.recs[off] = r
	}
}

// skipped counts the offsets from, to the record at offset to, that
// retention dropped before the group read them (worker.noteStart).
func (k *keyRun) skipped(from, to int64) {
	g := k.g
	g.counts.skipped.Add(to - from)
	if obs := g.e.obs; obs != nil {
		obs.Observe(&engine.Event{Kind: engine.EventSkip, Topic: g.t.name, Group: g.name,
			Partition: k.s.p, Offset: from, To: to})
	}
}

// decode decodes r's record; one that cannot be decoded is keyless, and
// fails at once (undecodable).
func (k *keyRun) decode(r *keyRec) {
	r.rec, r.derr = decodeOrRaw(r.msg.Headers(), r.msg.Data(), r.md.Sequence.Stream, r.md.Timestamp)
	if r.derr != nil {
		r.rec.Key = nil
	}
}

// start starts every record the window lets start; a record delivered
// again below it (late) runs alone, once nothing else runs.
func (k *keyRun) start() {
	if len(k.late) > 0 {
		if k.running == 0 {
			r := k.late[0]
			k.late = k.late[1:]
			k.launch(r)
		}
		return
	}
	if k.win == nil {
		return
	}
	for {
		off, ok := k.win.Next()
		if !ok {
			return
		}
		k.launch(k.recs[off])
	}
}

// launch runs r's handler on a goroutine of its own.
func (k *keyRun) launch(r *keyRec) {
	w, s := k.w, k.s
	if r.noCount {
		r.noCount = false
	} else {
		r.attempt++
	}
	s.mu.Lock()
	s.renewRevokedLocked()
	revoked := s.revoked
	s.mu.Unlock()
	d := &engine.Delivery{Topic: k.g.t.name, Partition: s.p, ID: w.recordID(r.md.Sequence.Stream), Record: r.rec,
		Attempt: r.attempt, Revoked: revoked}
	k.running++
	go k.deliver(r, d) // exits when the handler returned and its outcome was settled and sent
}

// deliver runs on a handler goroutine: it calls the handler on d, settles
// the outcome on the server (an ack, a dead letter) and reports it.
func (k *keyRun) deliver(r *keyRec, d *engine.Delivery) {
	w, g := k.w, k.g
	var herr error
	if r.derr != nil {
		herr = undecodable(r.derr)
	} else {
		herr = w.call(d)
	}
	res := keyResult{r: r, herr: herr, verdict: kit.Judge(herr, d.Attempt, g.spec.Retry.MaxAttempts)}
	switch {
	case g.e.handlerCtx.Err() != nil:
		res.gone = true // Close gave up on it: nothing is committed
	case res.verdict == kit.Ack:
		// Counted before the ack, which Drain may see (worker.settle).
		g.counts.delivered.Add(1)
		ctx, cancel := g.e.ctx()
		_ = r.msg.DoubleAck(ctx)
		cancel()
		g.e.committed()
	case res.verdict == kit.DeadLetter:
		if w.deadLetter(r.msg, d, herr, letterID(d, r.md)) {
			res.gone = true // given back (a Nak): the worker stopped
			break
		}
		ctx, cancel := g.e.ctx()
		_ = termConfirmed(ctx, r.msg, "logbus: dead-lettered")
		cancel()
		g.e.committed()
	case res.verdict == kit.Retry:
		g.counts.retried.Add(1)
		if obs := g.e.obs; obs != nil {
			obs.Observe(&engine.Event{Kind: engine.EventRetry, Topic: g.t.name, Group: g.name, Consumer: w.m.name,
				Partition: d.Partition, Offset: d.Record.Offset, ID: d.ID, Record: d.Record, Attempt: d.Attempt,
				Delay: g.spec.Retry.Delay(d.Attempt), Err: herr})
		}
	}
	k.results <- res // buffered for every handler goroutine: never blocks
}

// ended takes a delivery's outcome into the window.
func (k *keyRun) ended(res keyResult) {
	k.running--
	r := res.r
	inWin := k.win != nil && k.win.Running(r.off) && k.recs[r.off] == r
	switch {
	case res.gone:
		if inWin {
			delete(k.recs, r.off)
			k.win.GiveBack(r.off) // not started again: the worker is stopping
			k.gaveBack = true
		}
	case res.verdict == kit.Ack || res.verdict == kit.DeadLetter:
		if inWin {
			delete(k.recs, r.off)
			k.win.Settle(r.off)
		}
	default: // a retry; given back (ErrNotDelivered, or abandoned): it waits, its key held
		delay := k.g.e.cfg.pollWait
		switch res.verdict {
		case kit.Retry:
			delay = k.g.spec.Retry.Delay(r.attempt)
		case kit.NotDelivered:
			r.noCount = true
		}
		if res.verdict != kit.NotDelivered && r.attempt >= int(r.md.NumDelivered) {
			r.local++ // the next attempt is one the server does not count
		}
		r.until = time.Now().Add(delay)
		if inWin {
			k.win.Fail(r.off)
			k.armDue()
		} else {
			k.late = append(k.late, r) // a late record retries alone too, without a backoff
		}
	}
}

// armDue sets the timer to the earliest backoff's end.
func (k *keyRun) armDue() {
	var first time.Time
	for off, r := range k.recs {
		if k.win.Retrying(off) && (first.IsZero() || r.until.Before(first)) {
			first = r.until
		}
	}
	k.due.Stop()
	if !first.IsZero() {
		k.due.Reset(time.Until(first))
	}
}

// retryDue makes the records whose backoff is over ready again.
func (k *keyRun) retryDue() {
	if k.win == nil {
		return
	}
	now := time.Now()
	for off, r := range k.recs {
		if k.win.Retrying(off) && !r.until.After(now) {
			k.win.Retry(off)
		}
	}
	k.armDue()
}

// keepAlive tells the server that every record the worker holds is still
// being handled: they are not delivered again after AckWait.
func (k *keyRun) keepAlive() {
	for _, r := range k.recs {
		_ = r.msg.InProgress()
	}
	for _, msg := range k.over {
		_ = msg.InProgress()
	}
	for _, r := range k.late {
		_ = r.msg.InProgress()
	}
}

// handOver clears the slot's key-concurrency state and leaves what the
// worker read and did not settle to the partition's next owner: the
// window itself to another member of this broker (adopt), so nothing is
// delivered again and no attempt counted; else the records, given back to
// the server in stream order, which delivers them first to the next
// owner, with Attempt+1 (group.giveBack: without counting an attempt when
// nothing else is unacked and none was retried here).
func (k *keyRun) handOver() {
	s := k.s
	abandoned := k.g.e.handlerCtx.Err() != nil
	local := !abandoned && !k.gaveBack && k.w.g.members.nextOwner(k.w) == ownerLocal
	s.mu.Lock()
	s.keyed, s.running, s.oldest, s.heldRec = false, 0, -1, nil
	s.inFlight, s.retrying = false, false
	if local {
		s.keyKept = &keyState{epoch: k.epoch, win: k.win, recs: k.recs, over: k.over, late: k.late}
	}
	s.setPhaseLocked(parked)
	s.mu.Unlock()
	if abandoned || local {
		return // abandoned: Close gave up, the server delivers them again after AckWait
	}
	k.g.giveBackWindow(s, &keyState{epoch: k.epoch, recs: k.recs, over: k.over, late: k.late})
}

// giveBackWindow gives back to the server, in stream order, the records
// of st (a window of partition s) that were read and not settled, for
// whoever owns the partition next: with Attempt+1 (a Nak) when one was
// retried in this process, else as giveBack does.
func (g *group) giveBackWindow(s *slot, st *keyState) {
	rs := make([]*keyRec, 0, len(st.recs)+len(st.late))
	for _, r := range st.recs {
		rs = append(rs, r)
	}
	rs = append(rs, st.late...)
	slices.SortFunc(rs, func(a, b *keyRec) int { return cmp.Compare(a.off, b.off) })
	msgs := make([]record, 0, len(rs)+len(st.over))
	counted := true
	for _, r := range rs {
		msgs = append(msgs, r.msg)
		counted = counted && r.local == 0
	}
	msgs = append(msgs, st.over...)
	if !counted {
		for _, m := range msgs {
			_ = m.Nak()
		}
		return
	}
	g.giveBack(s, st.epoch, msgs...)
}

// show publishes the partition's state for Pause and the repositions (the
// phase), Snapshot (in flight, oldest unsettled) and the stuck watchdog
// (the record holding the window: the oldest unsettled one).
func (k *keyRun) show() {
	s := k.s
	ph := parked
	switch {
	case k.running > 0:
		ph = busy
	case k.asked > 0:
		ph = fetching
	}
	oldest, attempt, inFlight, retrying := int64(-1), 0, false, false
	var held *engine.Record
	if k.win != nil && k.win.Unsettled() > 0 {
		oldest = k.win.Committed()
		if r := k.recs[oldest]; r != nil {
			held, attempt = r.rec, r.attempt
			inFlight, retrying = k.win.Running(oldest), k.win.Retrying(oldest)
		}
	}
	if oldest != k.shown.oldest || attempt != k.shown.attempt {
		k.starts++
		k.shown.oldest, k.shown.attempt = oldest, attempt
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.running, s.oldest, s.heldRec = k.running, oldest, held
	s.inFlight, s.retrying, s.attempt = inFlight, retrying, attempt
	s.starts, s.offset, s.consumer = k.starts, oldest, k.w.m.name
	if s.phase != ph {
		s.setPhaseLocked(ph)
	}
}
