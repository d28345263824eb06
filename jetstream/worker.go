package jetstream

// The worker loop: one partition of a group, delivered to one local
// member, one record at a time, until the membership tells the worker to
// stop (a batch consumer's loop is batch.go's). It moves the partition's
// slot (slot.go) through its phases, and settles each outcome on the
// server: an ack, a retry, a dead letter (dlq.go stores it). Redriven dead
// letters (redrive.go) go through the same paths, before the partition's
// records.

import (
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/logbus/logbus/engine"
	"github.com/logbus/logbus/internal/kit"
	natsjs "github.com/nats-io/nats.go/jetstream"
)

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
	s.claim()
	return &worker{g: g, s: s, m: m, stop: make(chan struct{}), done: make(chan struct{})}
}

// signalStop tells the worker to stop after its delivery in flight.
func (w *worker) signalStop() {
	w.once.Do(func() {
		close(w.stop)
		w.s.stopWorker()
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

// pause waits d, or less when stopped; false when stopped.
func (w *worker) pause(d time.Duration) bool { return kit.Wait(d, w.stop, nil) }

// run is the worker's goroutine: gate, pull one record, hold it while the
// slot is held, deliver it, settle it; again until stopped.
func (w *worker) run() {
	defer func() {
		w.s.setPhase(parked)
		w.g.members.exited(w) // before done: whoever waits for the worker waits for its hand-over too
		close(w.done)
	}()
	if w.m.bh != nil {
		newBatchRun(w).run()
		return
	}
	if w.g.spec.KeyConcurrency > 1 {
		newKeyRun(w).run()
		return
	}
	s := w.s
	// One record in flight: a batch consumer that served the partition
	// before may have raised MaxAckPending (batch.go).
	_ = w.g.pause.setMaxAckPending(s.p, 1)
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
				w.take(msg, epoch)
				continue
			}
			for s.holds > 0 && !w.stopping() && s.pending == nil {
				s.setPhaseLocked(parked)
				s.waitLocked(w.stop, nil)
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
			s.setPhaseLocked(fetching)
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
		w.take(msg, epoch)
	}
}

// take delivers msg, fetched in epoch, once the slot lets it (await), and
// keeps it for the next delivery when the consumer gave it back.
func (w *worker) take(msg record, epoch uint64) {
	revoked, ok := w.await(msg, epoch)
	if !ok {
		return
	}
	if w.deliver(msg, revoked) {
		w.keepGivenBack(msg, epoch)
		return
	}
	// The phase a delivery leaves the worker in: fetching when its ack
	// opened the next pull.
	if w.pre != nil {
		w.s.setPhase(fetching)
		return
	}
	w.s.setPhase(parked)
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
	t := time.NewTimer(w.g.e.cfg.pollWait)
	defer t.Stop()
	s.mu.Lock()
	s.pending, s.pendingEpoch = msg, epoch
	s.setPhaseLocked(parked)
	s.waitLocked(w.stop, t.C)
	s.mu.Unlock()
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

// pullerRoom is the answers a puller buffers (newPuller), beyond a key
// window's pulls.
const pullerRoom = 64

// puller returns the partition's puller, making it on first use.
func (w *worker) puller() (*puller, error) {
	return w.s.pullerFor(false, func() (*puller, error) {
		room := pullerRoom
		if n := w.g.spec.KeyConcurrency; n > 1 {
			room += engine.KeyWindowSize(n) // a pull asks for up to the window's size (keys.go)
		}
		room += w.m.batch.MaxSize // a batch consumer's pull asks for up to a batch (batch.go); 0 for others
		return newPuller(w.g.e.js, w.g.e.names.stream(w.g.t.name, w.s.p), w.g.e.names.consumer(w.g.name, w.s.p), room)
	})
}

// redrivePuller returns the partition's redrive puller, making it on first
// use.
func (w *worker) redrivePuller() (*puller, error) {
	return w.s.pullerFor(true, func() (*puller, error) {
		return newPuller(w.g.e.js, w.g.e.names.redriveStream(w.g.t.name, w.g.name), w.g.e.names.redriveConsumer(w.s.p), pullerRoom)
	})
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

// await holds msg while the slot is held (a pause, a reposition), keeping
// it alive on the server. It returns the delivery's Revoked channel and
// true when msg may be delivered; false when a reset made it moot, or the
// worker stopped while holding it (handOver).
func (w *worker) await(msg record, epoch uint64) (<-chan struct{}, bool) {
	s := w.s
	keep := keeper{every: w.g.e.cfg.ackWait / 3}
	defer keep.stop()
	s.mu.Lock()
	for {
		switch {
		case s.epoch != epoch && !isRedriven(msg): // a reset of the consumer does not concern a redriven letter
			s.setPhaseLocked(parked)
			s.mu.Unlock()
			return nil, false
		case s.holds == 0 && !w.stopping():
			s.renewRevokedLocked()
			revoked := s.startLocked()
			s.mu.Unlock()
			return revoked, true
		case w.stopping():
			s.setPhaseLocked(parked)
			s.mu.Unlock()
			return w.handOver(msg, epoch)
		}
		s.setPhaseLocked(holding)
		keep.start()
		if s.waitLocked(w.stop, keep.ticks()) {
			s.mu.Unlock()
			_ = msg.InProgress()
			s.mu.Lock()
		}
	}
}

// keeper ticks every AckWait/3 once started, for the records a worker
// holds while the slot does not let it deliver them: at each tick the
// server is told they are still being handled. Only its worker uses it.
type keeper struct {
	every time.Duration
	t     *time.Ticker
}

// start starts the ticks, once.
func (k *keeper) start() {
	if k.t == nil {
		k.t = time.NewTicker(k.every)
	}
}

// ticks is the ticks' channel: nil, never ready, until start.
func (k *keeper) ticks() <-chan time.Time {
	if k.t == nil {
		return nil
	}
	return k.t.C
}

func (k *keeper) stop() {
	if k.t != nil {
		k.t.Stop()
	}
}

// handOver is await's end for a worker that stopped while holding msg,
// fetched in epoch, by who owns the partition next (nextOwner): another
// local member's worker gets it kept (no redelivery); when a member of
// another broker does, or this one is closing, it is delivered here, as a
// delivery in flight (true, with its Revoked channel), unless a hold or a
// reset came meanwhile; else it is given back.
func (w *worker) handOver(msg record, epoch uint64) (<-chan struct{}, bool) {
	s := w.s
	switch w.g.members.nextOwner(w) {
	case ownerLocal:
		s.keep(msg, epoch)
		return nil, false
	case ownerRemote:
		s.mu.Lock()
		if s.holds == 0 && s.epoch == epoch {
			revoked := s.startLocked()
			s.mu.Unlock()
			return revoked, true
		}
		s.mu.Unlock()
	}
	w.g.giveBack(s, epoch, msg)
	return nil, false
}

// recordID is the ID of the partition's record at stream sequence seq.
func (w *worker) recordID(seq uint64) string {
	return w.g.t.streams[w.s.p].CachedInfo().Config.Name + "-" + strconv.FormatUint(seq, 10)
}

// deliver runs the handler on msg (a record of the partition, or a
// redriven dead letter), keeping it alive on the server while it runs,
// and settles the outcome. It reports whether the consumer gave the
// delivery back before it received it (ErrNotDelivered), which the caller
// keeps for the next delivery.
func (w *worker) deliver(msg record, revoked <-chan struct{}) (gaveBack bool) {
	md, err := msg.Metadata()
	if err != nil {
		_ = msg.Nak()
		return false
	}
	rm, redriven := msg.(redrivenMsg)
	var d *engine.Delivery
	var derr error
	call := w.call
	if redriven {
		d, derr = redelivery(rm, md, w.g.t.name, w.s.p, revoked)
		w.s.mu.Lock()
		w.s.beginLocked(d.Record.Offset, d.Attempt, w.m.name) // not the partition's position: no skip to count
		w.s.mu.Unlock()
		call = w.callOne
	} else {
		seq := md.Sequence.Stream
		w.more = md.NumPending > 0
		var rec *engine.Record
		rec, derr = decodeOrRaw(msg.Headers(), msg.Data(), seq, md.Timestamp)
		d = &engine.Delivery{Topic: w.g.t.name, Partition: w.s.p, ID: w.recordID(seq), Record: rec,
			Attempt: int(md.NumDelivered), Revoked: revoked}
		w.noteStart(seq, d.Attempt)
	}
	verdict, herr := w.handle(msg, d, derr, call)
	switch {
	case w.g.e.handlerCtx.Err() != nil:
		return false // Close gave up on this delivery: nothing is committed (a redriven letter stays queued)
	case verdict == kit.NotDelivered:
		return true
	case redriven:
		w.settleRedriven(rm, md, d, herr)
	default:
		w.settle(msg, d, herr)
	}
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
// returns what becomes of the record ([kit.Judge]) and the error.
func (w *worker) handle(msg record, d *engine.Delivery, derr error, call func(*engine.Delivery) error) (kit.Verdict, error) {
	stopKeep := w.keepAlive(msg)
	var herr error
	if derr != nil {
		herr = undecodable(derr)
	} else {
		herr = call(d)
	}
	stopKeep()
	verdict := kit.Judge(herr, d.Attempt, w.g.spec.Retry.MaxAttempts)
	w.s.ended(verdict == kit.Retry)
	return verdict, herr
}

// undecodable is the handler's error for a record that could not be
// decoded: permanent, so it is dead-lettered at once.
func undecodable(derr error) error { return fmt.Errorf("%w: %v", engine.ErrPermanent, derr) }

// noteStart records, for the snapshot and the skip count, that a delivery
// from stream sequence seq begins.
func (w *worker) noteStart(seq uint64, attempt int) {
	g := w.g
	from := w.s.begin(seq, attempt, w.m.name)
	if from == 0 {
		return
	}
	g.counts.skipped.Add(int64(seq - from))
	if obs := g.e.obs; obs != nil {
		obs.Observe(&engine.Event{Kind: engine.EventSkip, Topic: g.t.name, Group: g.name,
			Partition: w.s.p, Offset: int64(from) - 1, To: int64(seq) - 1})
	}
}

// call runs the member's handler ([kit.Call]: a panic becomes a
// *PanicError).
func (w *worker) call(d *engine.Delivery) error {
	return kit.Call(w.g.e.handlerCtx, w.m.h, d)
}

// callBatch runs the member's batch handler ([kit.Call]: a panic becomes a
// *PanicError).
func (w *worker) callBatch(b *engine.Batch) error {
	return kit.Call(w.g.e.handlerCtx, w.m.bh, b)
}

// callOne runs the member's handler on one delivery: a batch consumer's
// as a batch of one record.
func (w *worker) callOne(d *engine.Delivery) error {
	if w.m.bh == nil {
		return w.call(d)
	}
	b := &engine.Batch{Topic: d.Topic, Partition: d.Partition, Records: []*engine.Record{d.Record},
		IDs: []string{d.ID}, Attempt: d.Attempt, Revoked: d.Revoked}
	_, failed := kit.Outcome(w.callBatch(b), 1)
	return failed
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
		g.counts.delivered.Add(1)
		w.s.settled(d)
		w.ackNext(msg, w.more)
		g.e.committed()
	case kit.DeadLetter:
		md, _ := msg.Metadata()
		if w.deadLetter(msg, d, herr, letterID(d, md)) {
			return true
		}
		w.terminate(msg, d, md)
		w.s.settled(d)
		g.e.committed()
	default:
		w.retry(msg, d, herr)
		return true
	}
	return false
}

// settleRedriven tells the server the outcome of a redriven letter's
// delivery, as settle does a record's, but commits nothing in the
// partition: an ack (or, once dead-lettered again, an ack too) removes
// the letter from the redrive stream.
func (w *worker) settleRedriven(msg redrivenMsg, md *natsjs.MsgMetadata, d *engine.Delivery, herr error) {
	g := w.g
	ack := func() {
		ctx, cancel := g.e.ctx()
		_ = msg.DoubleAck(ctx)
		cancel()
		g.e.committed()
	}
	switch kit.Judge(herr, d.Attempt, g.spec.Retry.MaxAttempts) {
	case kit.Abandoned, kit.NotDelivered:
		_ = msg.Nak()
	case kit.Ack:
		g.counts.delivered.Add(1) // before the ack, which Drain may see
		ack()
	case kit.DeadLetter:
		// Its own letter ID: the redrive consumer's sequences are not the
		// partition consumer's.
		if !w.deadLetter(msg, d, herr, letterID(d, md)+"-r"+strconv.FormatUint(md.Sequence.Stream, 10)) {
			ack()
		}
	default:
		w.retry(msg, d, herr)
	}
}

// retry sends msg back to be delivered again after the policy's backoff,
// counted and reported.
func (w *worker) retry(msg record, d *engine.Delivery, herr error) {
	g := w.g
	g.counts.retried.Add(1)
	delay := g.spec.Retry.Delay(d.Attempt)
	_ = msg.NakWithDelay(delay)
	if obs := g.e.obs; obs != nil {
		obs.Observe(&engine.Event{Kind: engine.EventRetry, Topic: g.t.name, Group: g.name, Consumer: w.m.name,
			Partition: d.Partition, Offset: d.Record.Offset, ID: d.ID, Record: d.Record, Attempt: d.Attempt, Delay: delay, Err: herr})
	}
}

// deadLetter stores the dead letter of d's record (letters.store), for a
// worker that gave up on it; the caller then settles the record. When the
// server refuses the letter, it is tried again after the group's retry
// backoff, the handler not called again, the record kept alive, up to
// MaxAttempts tries in all; then it is dropped (letters.drop), and the
// record settled all the same. When the server cannot be asked (no
// answer, no connection), it is tried again, backing off the same way,
// for as long as it takes. Meanwhile Snapshot shows the partition
// Retrying. deadLetter reports whether the worker stopped first: the
// record is then given back unsettled (the next owner delivers it again,
// with Attempt+1) and the caller must not settle it.
func (w *worker) deadLetter(msg record, d *engine.Delivery, herr error, id string) (stopped bool) {
	g := w.g
	if g.spec.DeadLetterLimit == engine.NoDeadLetters { // a letter is evicted as it comes
		g.letters.drop(d, herr, nil, w.m.name, id)
		return false
	}
	for try := 1; ; try++ {
		ctx, cancel := g.e.ctx()
		err := g.letters.store(ctx, msg, d, herr, w.m.name, id)
		cancel()
		switch {
		case err == nil:
			return false
		case refused(err) && try >= g.spec.Retry.MaxAttempts:
			g.letters.drop(d, herr, err, w.m.name, id)
			return false
		}
		if !w.waitToStore(msg, d, g.spec.Retry.Delay(try)) {
			g.letters.forget(id)
			_ = msg.Nak()
			return true
		}
	}
}

// waitToStore waits out delay before a dead letter's next store, keeping
// msg alive on the server; false when the worker stopped (or Close gave
// up) first.
func (w *worker) waitToStore(msg record, d *engine.Delivery, delay time.Duration) bool {
	defer w.s.retryingStore(d.Attempt)()
	defer w.keepAlive(msg)()
	return kit.Wait(delay, w.stop, w.g.e.handlerCtx.Done())
}

// terminate tells the server a dead-lettered record is done with (a
// Term), and waits until the ack floor passes it: a Term has no
// confirmation, and Committed and Drain must see the dead letter settled
// when the handler's caller does.
func (w *worker) terminate(msg record, d *engine.Delivery, md *natsjs.MsgMetadata) {
	if err := msg.TermWithReason("logbus: dead-lettered"); err != nil || md == nil {
		return
	}
	ctx, cancel := w.g.e.ctx()
	defer cancel()
	for {
		info, err := w.g.consumers[d.Partition].Info(ctx)
		if err != nil || info.AckFloor.Stream >= md.Sequence.Stream {
			return
		}
		pause(ctx, 2*time.Millisecond)
		if ctx.Err() != nil {
			return
		}
	}
}

// redriveStep delivers one redriven letter of the worker's partition, if
// there is one: one the previous local worker kept first, else the next
// from the partition's redrive consumer. When the consumer has nothing
// waiting and nothing unacked, it records that, and the worker goes on
// with the partition's records. A letter unacked elsewhere (a crashed
// member's, until AckWait, or one waiting out its backoff) keeps the
// worker here, as a record in flight would: order is kept.
func (w *worker) redriveStep() {
	s, g := w.s, w.g
	s.mu.Lock()
	if msg, ok := s.pending.(redrivenMsg); ok && !w.stopping() {
		s.pending = nil
		s.mu.Unlock()
		w.take(msg, s.currentEpoch()) // a reset of the partition's consumer does not concern the letter
		return
	}
	gen := s.redriveGen
	s.setPhaseLocked(fetching)
	s.mu.Unlock()
	defer s.setPhase(parked)
	ctx, cancel := g.e.ctx()
	info, err := g.redrive.consumers[s.p].Info(ctx)
	waiting := err == nil && (info.NumPending > 0 || info.NumAckPending > 0)
	if err == nil && !waiting {
		waiting, err = g.redrive.undelivered(ctx, s.p, info.Delivered.Stream)
	}
	cancel()
	if err != nil {
		w.pause(g.e.cfg.pollWait)
		return
	}
	if !waiting {
		s.lookedForRedrive(gen) // unless a Redrive came since the look
		return
	}
	p, err := w.redrivePuller()
	if err != nil {
		w.pause(g.e.cfg.pollWait)
		return
	}
	hadPin := p.pin != ""
	wait := g.e.cfg.pollWait
	if err := p.pull(wait); err != nil {
		w.pause(g.e.cfg.pollWait)
		return
	}
	msg, err := p.next(g.e.handlerCtx.Done(), wait+time.Second)
	switch {
	case msg != nil:
		w.take(redrivenMsg{msg}, s.currentEpoch())
	case errors.Is(err, errPinned) && hadPin:
		// The pin lapsed while the consumer was idle (PinnedTTL): the
		// next pull, without it, gets a new one.
	case err != nil:
		w.pause(g.e.cfg.pollWait)
	}
}
