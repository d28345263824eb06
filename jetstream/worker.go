package jetstream

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/logbus/logbus/engine"
	"github.com/logbus/logbus/internal/kit"
)

// phase is what a partition's worker is doing.
type phase int8

const (
	parked   phase = iota // waiting at the gate, or between pulls
	fetching              // a pull is open on the server
	holding               // it holds a fetched record it may not deliver yet
	busy                  // a handler runs
)

// slot is one partition of a group in this broker. It outlives workers:
// a pause or a reposition holds the slot whichever member's worker runs
// it.
type slot struct {
	p int

	mu      sync.Mutex
	holds   int           // Pause and repositions under way: no delivery may start
	epoch   uint64        // bumped by every reset of the consumer: a record fetched before is dropped
	phase   phase         // of the current worker
	revoked chan struct{} // closed when a hold begins or the worker must stop; the Delivery's Revoked
	changed chan struct{} // closed and replaced on every change of the above

	// pending is a record a stopping worker fetched but did not deliver,
	// handed to the partition's next local worker (no redelivery), with
	// the epoch it was fetched in.
	// next is the stream sequence the partition should deliver next, 0
	// until it has delivered one: a record past it means retention took
	// the ones between before the group read them (counted as Skipped).
	next uint64

	pending      record
	pendingEpoch uint64

	// What the snapshot tells of the partition's delivery: a handler runs
	// (inFlight), or the last attempt failed and the server will deliver
	// the record again after its backoff (retrying); attempt is that
	// delivery's. Local: a delivery in another broker is not seen.
	inFlight, retrying bool
	attempt            int

	// Redrive (redrive.go): redriveGen counts the reasons to look at the
	// partition's redrive consumer (a Redrive, a wake-up, a new worker);
	// redriveSeen is the count when a worker last found it empty.
	redriveGen, redriveSeen uint64

	// For stuck detection (stuck.go): starts counts the deliveries begun,
	// and offset and consumer say whose record the one in flight is.
	starts   uint64
	offset   int64
	consumer string

	worker *worker // guarded by the group's mu

	// puller is the partition's pull subscription, made by its first
	// worker (guarded by mu) and used by one worker at a time; closed by
	// Close.
	puller *puller
	// rpuller is the same for the partition's redrive consumer.
	rpuller *puller
}

func newSlot(p int) *slot {
	return &slot{p: p, revoked: make(chan struct{}), changed: make(chan struct{})}
}

// signal wakes whoever waits on the slot. s.mu must be held.
func (s *slot) signal() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// revoke closes the current Revoked channel once. s.mu must be held.
func (s *slot) revoke() {
	select {
	case <-s.revoked:
	default:
		close(s.revoked)
	}
}

func (s *slot) hold() {
	s.mu.Lock()
	s.holds++
	s.revoke()
	s.signal()
	s.mu.Unlock()
}

func (s *slot) unhold() {
	s.mu.Lock()
	s.holds--
	s.signal()
	s.mu.Unlock()
}

func (s *slot) bumpEpoch(seq uint64) {
	s.mu.Lock()
	s.epoch++
	s.next = seq
	s.signal()
	s.mu.Unlock()
}

// settled moves next past d's record.
func (s *slot) settled(d *engine.Delivery) {
	s.mu.Lock()
	if seq := uint64(d.Record.Offset) + 1; s.next == seq {
		s.next = seq + 1
	}
	s.mu.Unlock()
}

func (s *slot) setPhase(ph phase) {
	s.mu.Lock()
	s.phase = ph
	s.signal()
	s.mu.Unlock()
}

func (s *slot) busyNow() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.phase == busy
}

// waitIdle waits until no handler runs on the slot and, with
// notFetching, no pull is open either, or until ctx ends.
func (s *slot) waitIdle(ctx context.Context, notFetching bool) error {
	s.mu.Lock()
	for s.phase == busy || notFetching && s.phase == fetching {
		ch := s.changed
		s.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
		s.mu.Lock()
	}
	s.mu.Unlock()
	return nil
}

// worker delivers one partition of a group to one local member, one
// record at a time, until it is told to stop.
type worker struct {
	g    *group
	s    *slot
	m    *member
	once sync.Once
	pre  *pull         // the next pull, opened with (or before) the last ack; only run touches it
	more bool          // the server had records after the one being delivered; only run touches it
	stop chan struct{} // closed by signalStop
	done chan struct{} // closed when run returns
}

func newWorker(g *group, s *slot, m *member) *worker {
	s.mu.Lock()
	s.redriveGen++    // a new worker looks for redriven letters first: a previous owner may have left some
	if s.holds == 0 { // a fresh Revoked for the new owner
		select {
		case <-s.revoked:
			s.revoked = make(chan struct{})
		default:
		}
	}
	s.mu.Unlock()
	return &worker{g: g, s: s, m: m, stop: make(chan struct{}), done: make(chan struct{})}
}

// signalStop tells the worker to stop after its delivery in flight.
func (w *worker) signalStop() {
	w.once.Do(func() {
		close(w.stop)
		w.s.mu.Lock()
		w.s.revoke()
		w.s.signal()
		w.s.mu.Unlock()
	})
}

func (w *worker) stopping() bool {
	select {
	case <-w.stop:
		return true
	default:
		return false
	}
}

// crashed reports a worker whose connection is gone: it cannot unpin.
func (w *worker) crashed() bool { return w.g.e.nc != nil && w.g.e.nc.IsClosed() }

// run is the worker's goroutine: gate, pull one record, hold it while the
// slot is held, deliver it, settle it; again until stopped.
func (w *worker) run() {
	defer func() {
		w.s.setPhase(parked)
		w.g.exited(w) // before done: whoever waits for the worker waits for its hand-over too
		close(w.done)
	}()
	if w.m.bh != nil {
		w.runBatches()
		return
	}
	s := w.s
	// One record in flight: a batch consumer that served the partition
	// before may have raised MaxAckPending (batch.go).
	_ = w.g.setMaxAckPending(s.p, 1)
	for {
		var msg record
		var err error
		var epoch uint64
		if w.pre != nil { // a pull opened with the last ack: collect it first, whatever happened since
			msg, err = w.pre.collect()
			epoch = w.pre.epoch
			w.pre = nil
		} else {
			s.mu.Lock()
			// A record kept for this partition goes first; await holds it
			// (alive on the server) while the slot is held.
			if msg, epoch := s.pending, s.pendingEpoch; msg != nil && !w.stopping() {
				s.pending = nil
				s.mu.Unlock()
				if revoked, ok := w.await(msg, epoch); ok {
					if w.deliver(msg, revoked) {
						w.keepGivenBack(msg, epoch)
						continue
					}
					w.afterDelivery()
				}
				continue
			}
			for s.holds > 0 && !w.stopping() && s.pending == nil {
				s.phase = parked
				s.signal()
				ch := s.changed
				s.mu.Unlock()
				select {
				case <-ch:
				case <-w.stop:
				}
				s.mu.Lock()
			}
			if w.stopping() {
				s.mu.Unlock()
				return
			}
			if s.pending != nil {
				s.mu.Unlock()
				continue
			}
			if s.wantsRedrive() { // redriven dead letters go before the records not read yet
				s.mu.Unlock()
				w.redriveStep()
				continue
			}
			s.phase = fetching
			s.signal()
			epoch = s.epoch
			s.mu.Unlock()
			msg, err = w.open().collect()
		}
		if msg == nil {
			s.setPhase(parked)
			w.g.pullFailed(err)
			if err != nil && !w.pause(w.g.e.cfg.pollWait) {
				return
			}
			continue
		}
		revoked, ok := w.await(msg, epoch)
		if !ok {
			continue
		}
		if w.deliver(msg, revoked) {
			w.keepGivenBack(msg, epoch)
			continue
		}
		w.afterDelivery()
	}
}

// keepGivenBack keeps a delivery the consumer gave back before receiving
// it (a Stream that is closing, or was revoked before anyone received it) for
// the partition's next delivery, without telling the server: so its
// Attempt does not count up, and a consumer that keeps giving back does
// not burn attempts in a loop. The worker then waits for what made the
// consumer give it back to change (a stop, a hold, a reset), at most a
// poll wait, before it tries again.
func (w *worker) keepGivenBack(msg record, epoch uint64) {
	s := w.s
	s.mu.Lock()
	s.pending, s.pendingEpoch = msg, epoch
	s.phase = parked
	s.signal()
	ch := s.changed
	s.mu.Unlock()
	t := time.NewTimer(w.g.e.cfg.pollWait)
	defer t.Stop()
	select {
	case <-ch:
	case <-w.stop:
	case <-t.C:
	}
}

// afterDelivery sets the phase a delivery leaves the worker in: fetching
// when its ack opened the next pull.
func (w *worker) afterDelivery() {
	if w.pre != nil {
		w.s.setPhase(fetching)
		return
	}
	w.s.setPhase(parked)
}

// pull is one open pull for the partition's next record.
type pull struct {
	p     *puller
	err   error
	abort <-chan struct{} // closed when Close gives up: stop waiting
	wait  time.Duration
	epoch uint64 // the slot's epoch when it was opened
}

// open opens a pull that waits up to the poll wait on the server. The
// worker waits for its answer (up to a second more than the server
// takes), never cutting it short, and an answer that comes later is the
// next pull's: the puller's subscription outlives the pull. Only when
// Close gives up does collect stop waiting.
func (w *worker) open() *pull {
	p, err := w.puller()
	if err != nil {
		return &pull{err: err}
	}
	wait := w.g.e.cfg.pollWait
	return &pull{p: p, err: p.pull(wait), abort: w.g.e.handlerCtx.Done(), wait: wait}
}

// collect waits for the pull's record: nil when there was none.
func (p *pull) collect() (record, error) {
	if p.err != nil {
		return nil, p.err
	}
	return p.p.next(p.abort, p.wait+time.Second)
}

// ackNext acks msg and opens the pull for the next record in the same
// message (pull.go), when nothing holds the partition, no redriven letter
// waits (it goes first) and the server had more records for it: the
// server delivers the next record the moment it read the ack (one in
// flight: MaxAckPending 1), and the worker does not wait for the ack's
// reply: the pull's answer tells the server read the ack, and the worker
// always collects it before it parks, so a reset never meets an ack still
// on its way.
//
// When the server had no more records (more is false), the pull opens
// first and the ack is confirmed (DoubleAck): the partition is idle, so
// the round trip costs no throughput, and Drain, woken by the commit,
// finds it on the server at once instead of at its next poll. When the
// worker will not pull next (a hold, a stop) the ack is confirmed and no
// pull opens.
func (w *worker) ackNext(msg record, more bool) {
	s := w.s
	s.mu.Lock()
	ok := s.holds == 0 && !w.stopping() && s.pending == nil && !s.wantsRedrive()
	epoch := s.epoch
	s.mu.Unlock()
	if ok && more {
		if p, err := w.puller(); err == nil {
			wait := w.g.e.cfg.pollWait
			if err := p.ackNext(msg, wait); err == nil {
				w.pre = &pull{p: p, abort: w.g.e.handlerCtx.Done(), wait: wait, epoch: epoch}
				return
			}
		}
	}
	if ok {
		w.pre = w.open()
		w.pre.epoch = epoch
	}
	ctx, cancel := w.g.e.ctx()
	_ = msg.DoubleAck(ctx)
	cancel()
}

// pause waits d, or less when stopped; false when stopped.
func (w *worker) pause(d time.Duration) bool { return kit.Wait(d, w.stop, nil) }

// await holds msg while the slot is held (a pause, a reposition), keeping
// it alive on the server. It returns the delivery's Revoked channel and
// true when msg may be delivered; false when a reset made it moot, or the
// worker stopped while holding it (then it is given back).
func (w *worker) await(msg record, epoch uint64) (<-chan struct{}, bool) {
	s := w.s
	var keep *time.Ticker
	defer func() {
		if keep != nil {
			keep.Stop()
		}
	}()
	s.mu.Lock()
	for {
		switch {
		case s.epoch != epoch && !isRedriven(msg): // a reset of the consumer does not concern a redriven letter
			s.phase = parked
			s.signal()
			s.mu.Unlock()
			return nil, false
		case s.holds == 0 && !w.stopping():
			select { // a revocation is spent once its hold ended: a fresh one
			case <-s.revoked:
				s.revoked = make(chan struct{})
			default:
			}
			s.phase = busy
			s.signal()
			revoked := s.revoked
			s.mu.Unlock()
			return revoked, true
		case w.stopping():
			s.phase = parked
			s.signal()
			s.mu.Unlock()
			switch w.g.nextOwner(w) {
			case ownerLocal: // the next local worker delivers it: not a redelivery
				s.mu.Lock()
				s.pending, s.pendingEpoch = msg, epoch
				s.mu.Unlock()
				return nil, false
			case ownerRemote: // finish it here, as a delivery in flight
				s.mu.Lock()
				if s.holds == 0 && s.epoch == epoch {
					s.phase = busy
					s.signal()
					revoked := s.revoked
					s.mu.Unlock()
					return revoked, true
				}
				s.mu.Unlock()
			}
			w.g.giveBack(s, epoch, msg)
			return nil, false
		}
		s.phase = holding
		s.signal()
		ch := s.changed
		s.mu.Unlock()
		if keep == nil {
			keep = time.NewTicker(w.g.e.cfg.ackWait / 3)
		}
		select {
		case <-ch:
		case <-w.stop:
		case <-keep.C:
			_ = msg.InProgress()
		}
		s.mu.Lock()
	}
}

// deliver runs the handler on msg, keeping it alive on the server while
// it runs, and settles the outcome.
// deliver reports whether the consumer gave the delivery back before it
// received it (ErrNotDelivered), which the caller keeps for the next
// delivery.
func (w *worker) deliver(msg record, revoked <-chan struct{}) (gaveBack bool) {
	if rm, ok := msg.(redrivenMsg); ok {
		return w.deliverLetter(rm, revoked)
	}
	g := w.g
	md, err := msg.Metadata()
	if err != nil {
		_ = msg.Nak()
		return false
	}
	seq := md.Sequence.Stream
	w.more = md.NumPending > 0
	id := g.t.streams[w.s.p].CachedInfo().Config.Name + "-" + strconv.FormatUint(seq, 10)
	rec, derr := decodeRecord(msg.Headers(), msg.Data(), seq, md.Timestamp)
	if derr != nil {
		rec = &engine.Record{Offset: int64(seq) - 1, Value: msg.Data(), Created: md.Timestamp}
	}
	d := &engine.Delivery{Topic: g.t.name, Partition: w.s.p, ID: id, Record: rec,
		Attempt: int(md.NumDelivered), Revoked: revoked}
	w.noteStart(seq, d.Attempt)
	verdict, herr := w.handle(msg, d, derr, w.call)
	if g.e.handlerCtx.Err() != nil {
		return false // Close gave up on this delivery: nothing is committed
	}
	if verdict == kit.NotDelivered {
		return true
	}
	w.settle(msg, d, herr)
	return false
}

// keepAlive tells the server every AckWait/3 that msgs (one delivery's
// record, or a batch's) are still being handled, until the returned func
// is called; that waits for a tick in progress, so no in-progress ack
// follows the outcome. A timer, not a goroutine per delivery.
func (w *worker) keepAlive(msgs ...record) (stop func()) {
	every := w.g.e.cfg.ackWait / 3
	var mu sync.Mutex
	stopped := false
	mu.Lock()
	defer mu.Unlock()
	var t *time.Timer
	t = time.AfterFunc(every, func() {
		mu.Lock()
		defer mu.Unlock()
		if !stopped {
			for _, m := range msgs {
				_ = m.InProgress()
			}
			t.Reset(every)
		}
	})
	return func() {
		mu.Lock()
		stopped = true
		mu.Unlock()
		t.Stop()
	}
}

// handle runs call on d, keeping msg alive on the server meanwhile, or,
// when its record could not be decoded (derr), fails it at once with an
// error wrapping ErrPermanent; then it notes the delivery's end. It
// returns what becomes of the record (kit.Judge) and the error.
func (w *worker) handle(msg record, d *engine.Delivery, derr error, call func(*engine.Delivery) error) (kit.Verdict, error) {
	stopKeep := w.keepAlive(msg)
	var herr error
	if derr != nil {
		herr = fmt.Errorf("%w: %v", engine.ErrPermanent, derr)
	} else {
		herr = call(d)
	}
	stopKeep()
	verdict := kit.Judge(herr, d.Attempt, w.g.spec.Retry.MaxAttempts)
	w.noteEnd(verdict == kit.Retry)
	return verdict, herr
}

// call runs the member's handler (kit.Call: a panic becomes a
// *PanicError).
func (w *worker) call(d *engine.Delivery) error {
	return kit.Call(w.g.e.handlerCtx, w.m.h, d)
}

// settle tells the server the outcome: an ack, a retry after the
// policy's backoff (NakWithDelay: the consumer's own BackOff does not
// apply to naks), a give-back, or a dead letter then a Term.
//
// It reports whether the record will come again (a retry, or a dead letter
// that could not be stored).
func (w *worker) settle(msg record, d *engine.Delivery, herr error) (again bool) {
	g := w.g
	switch kit.Judge(herr, d.Attempt, g.spec.Retry.MaxAttempts) {
	case kit.Abandoned, kit.NotDelivered: // given back (deliver keeps one never received): it counts as an attempt
		_ = msg.Nak()
		return true
	case kit.Ack:
		// Counted even when the ack fails: the handler succeeded, and an
		// ack the server refused (its record gone by retention) or whose
		// reply was lost may well have committed.
		// Counted before the ack, so that whoever sees the commit (Drain
		// polls the server) sees the count too.
		g.delivered.Add(1)
		w.s.settled(d)
		w.ackNext(msg, w.more)
		g.e.committed()
	case kit.DeadLetter:
		md, _ := msg.Metadata()
		if w.deadLetter(msg, d, herr, letterID(d, md)) {
			return true
		}
		g.terminate(msg, d, md)
		w.s.settled(d)
		g.e.committed()
	default:
		w.retry(msg, d, herr)
		return true
	}
	return false
}

// retry sends msg back to be delivered again after the policy's backoff,
// counted and reported.
func (w *worker) retry(msg record, d *engine.Delivery, herr error) {
	g := w.g
	g.retried.Add(1)
	delay := g.spec.Retry.Delay(d.Attempt)
	_ = msg.NakWithDelay(delay)
	if obs := g.e.obs; obs != nil {
		obs.Observe(&engine.Event{Kind: engine.EventRetry, Topic: g.t.name, Group: g.name, Consumer: w.m.name,
			Partition: d.Partition, Offset: d.Record.Offset, ID: d.ID, Record: d.Record, Attempt: d.Attempt, Delay: delay, Err: herr})
	}
}

// Who owns a partition next, for a worker that stops holding a record.
const (
	ownerNone   = iota // nobody in this broker, or Close gave up: give it back to the server
	ownerLocal         // another live member of this broker: keep it for its worker
	ownerRemote        // a member of another broker, or the broker is closing: deliver it here, as in flight
)

func (g *group) nextOwner(w *worker) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.gone.Load() != nil { // deleted: nothing more is delivered
		return ownerNone
	}
	if g.closed {
		// Close drained what it could and is stopping the workers: a
		// record that reached this one meanwhile is finished here, as a
		// delivery in flight, unless Close already gave up.
		if g.e.handlerCtx.Err() == nil {
			return ownerRemote
		}
		return ownerNone
	}
	for name, ps := range g.assign {
		if slices.Contains(ps, w.s.p) {
			if m := g.members[name]; m != nil && m != w.m && g.live(m) {
				return ownerLocal
			}
			if g.members[name] == nil {
				return ownerRemote
			}
		}
	}
	return ownerNone
}

// live reports whether m, a local member, may own partitions: its key is
// on the server and it has not left. g.mu must be held.
func (g *group) live(m *member) bool { return m.rev != 0 && !m.left && !m.evicted }

// giveBack returns records this broker fetched from slot s's partition
// (or its redrive consumer) and will not deliver, so that whoever owns
// the partition next, in any broker, gets them at once, within its poll
// wait, not after AckWait.
//
// The delivery given back must not count as an attempt: the next owner's
// first delivery of a record is Attempt 1 (the server's delivery count),
// and a Nak would make it 2. So records delivered once (all of them, in
// stream order) are given back by resetting the consumer to the first of
// them, which makes the server forget that they were delivered: it does
// so only when they are all that is unacked and nothing moved the
// consumer since they were fetched (the slot's epoch, the consumer's ack
// floor and last delivered sequence), and the pin, which this broker
// still holds, keeps everyone else's pulls out meanwhile. Otherwise (a
// record being retried, which the server must keep counting; Close gave
// up; the server did not answer) each is Nak'ed: it comes again at once,
// with Attempt+1.
func (g *group) giveBack(s *slot, epoch uint64, msgs ...record) {
	if len(msgs) == 0 {
		return
	}
	if !g.resetTo(s, epoch, msgs) {
		for _, m := range msgs {
			_ = m.Nak()
		}
	}
}

// resetTo is giveBack's reset; false when it did not reset.
func (g *group) resetTo(s *slot, epoch uint64, msgs []record) bool {
	if g.e.handlerCtx.Err() != nil || !g.e.js.Conn().IsConnected() { // a Nak is buffered while reconnecting; requests would wait
		return false
	}
	seqs := make([]uint64, len(msgs))
	for i, m := range msgs {
		md, err := m.Metadata()
		if err != nil || md.NumDelivered != 1 || i > 0 && md.Sequence.Stream <= seqs[i-1] {
			return false
		}
		seqs[i] = md.Sequence.Stream
	}
	redriven := isRedriven(msgs[0])
	s.mu.Lock()
	moved := s.epoch != epoch && !redriven
	s.mu.Unlock()
	if moved {
		return false
	}
	ctx, cancel := g.e.ctx()
	defer cancel()
	c, stream, name := g.consumers[s.p], g.t.streams[s.p], g.e.names.consumer(g.name, s.p)
	if redriven {
		c, stream, name = g.rconsumer[s.p], g.rdq, g.e.names.redriveConsumer(s.p)
	}
	info, err := c.Info(ctx)
	if err != nil || info.AckFloor.Stream+1 != seqs[0] || info.Delivered.Stream != seqs[len(seqs)-1] ||
		info.NumAckPending != len(msgs) {
		return false
	}
	_, err = stream.ResetConsumerToSequence(ctx, name, seqs[0])
	return err == nil
}
