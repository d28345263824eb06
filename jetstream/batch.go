package jetstream

// The worker's loop for a batch consumer (a member with a BatchHandler).
// It keeps every rule of the per-record loop (worker.go): one worker per
// partition of a group in this broker, records in stream order, a commit
// only after the handler returned, the slot's holds for Pause, Seek and
// Replay. It changes how many records one pull, one call and one commit
// cover:
//
//   - While a batch consumer serves a partition, its consumer's
//     MaxAckPending is the batch size (a per-record worker sets it back to
//     one when it takes the partition), so one pull brings up to MaxSize
//     records: a pull that answers at once with what there is (no_wait),
//     topped up for MaxWait when that is set.
//   - A batch that returns nil is acked in order, the last ack confirmed
//     (DoubleAck): a commit per batch.
//   - A failure names a record (BatchError.Index, else the first). The
//     records before it are acked; the failed one goes through the
//     per-record path's settle (NakWithDelay with the policy's backoff, or
//     a dead letter), alone; the records after it stay with the worker,
//     unacked and kept alive, counting no attempt, and nothing after the
//     failed record is delivered until it came back and was settled. A
//     record the server delivers again (NumDelivered above 1) always goes
//     alone, so Batch.Attempt holds for every record of a batch.

import (
	"cmp"
	"errors"
	"slices"
	"time"

	"github.com/logbus/logbus/engine"
	"github.com/logbus/logbus/internal/kit"
	natsjs "github.com/nats-io/nats.go/jetstream"
)

var _ engine.BatchSubscriber = (*eng)(nil)

// held is a record a batch worker fetched and has not settled: unacked on
// the server, kept alive by the worker.
type held struct {
	msg record
	seq uint64
	md  *natsjs.MsgMetadata
}

// batchRun is the loop of a worker whose member takes batches, and its
// state: only the worker's goroutine touches it.
type batchRun struct {
	w       *worker
	raised  bool      // MaxAckPending is the batch size
	buf     []held    // fetched, unsettled, in stream order
	epoch   uint64    // the slot's epoch buf was fetched in
	retry   uint64    // the sequence of a failed record waiting out its backoff; 0 when none
	retryAt time.Time // when the server delivers retry again
}

func newBatchRun(w *worker) *batchRun { return &batchRun{w: w, epoch: w.s.currentEpoch()} }

// run is the worker's run for a batch consumer.
func (b *batchRun) run() {
	w, s, g := b.w, b.w.s, b.w.g
	defer b.giveBackHeld()
	lastKeep := time.Now()
	for {
		if !b.raised {
			b.raised = g.pause.setMaxAckPending(s.p, w.m.batch.MaxSize) == nil
		}
		if len(b.buf) > 0 && time.Since(lastKeep) > g.e.cfg.ackWait/3 {
			b.keepAlive() // records held while a failed one waits out its backoff
			lastKeep = time.Now()
		}
		if !b.gate() {
			if len(b.buf) > 0 && b.retry == 0 && g.members.nextOwner(w) == ownerRemote {
				// As the per-record worker does with a record it holds: the
				// partition goes to another broker (or this one is closing),
				// so what was fetched is delivered here, as deliveries in
				// flight, rather than given back with an attempt more.
				b.finishHeld()
			}
			return
		}
		// s.mu is held.
		if len(b.buf) == 0 && b.retry == 0 && (s.wantsRedrive() || s.pending != nil) {
			// Redriven dead letters go before the records not read yet, as
			// batches of one.
			s.mu.Unlock()
			w.redriveStep()
			continue
		}
		if n := deliverable(b.buf, b.retry, w.m.batch.MaxSize); n > 0 {
			revoked := s.startLocked()
			s.mu.Unlock()
			if !b.deliverNext(n, revoked) {
				return
			}
			s.setPhase(parked)
			continue
		}
		s.setPhaseLocked(fetching)
		s.mu.Unlock()
		n := w.m.batch.MaxSize - len(b.buf)
		if b.retry != 0 || n < 1 || !b.raised {
			n = 1
		}
		got, err := b.fetch(n, b.retry == 0)
		s.setPhase(parked)
		g.pullFailed(err)
		for _, h := range got {
			b.buf = insertHeld(b.buf, h)
		}
		if len(got) == 0 && b.retry != 0 && len(b.buf) > 0 && b.retryGone() {
			b.retry = 0 // retention took it while it waited: the partition moves on
		}
		if err != nil && len(got) == 0 && !w.pause(g.e.cfg.pollWait) {
			return
		}
	}
}

// giveBackHeld returns what the worker still holds as it exits: given
// back, to come again at once with the same attempt (giveBack). When a
// failed record waits out its backoff they wait behind it, so that it
// still goes first: then they come again counted as one more attempt (the
// server counts deliveries).
func (b *batchRun) giveBackHeld() {
	g := b.w.g
	if b.retry == 0 {
		msgs := make([]record, len(b.buf))
		for i, h := range b.buf {
			msgs[i] = h.msg
		}
		g.giveBack(b.w.s, b.epoch, msgs...)
		return
	}
	delay := time.Until(b.retryAt) + g.e.cfg.pollWait
	for _, h := range b.buf {
		if delay > 0 {
			_ = h.msg.NakWithDelay(delay)
		} else {
			_ = h.msg.Nak()
		}
	}
}

// keepAlive tells the server the held records are still being handled.
func (b *batchRun) keepAlive() {
	for _, h := range b.buf {
		_ = h.msg.InProgress()
	}
}

// deliverNext delivers the first n held records as a batch (deliver),
// drops those it settled, and notes a record left waiting out its retry.
// It returns false when the worker must exit.
func (b *batchRun) deliverNext(n int, revoked <-chan struct{}) bool {
	settled, retry, attempt, ok := b.deliver(b.buf[:n], revoked)
	b.buf = slices.Delete(b.buf, 0, settled)
	b.retry = retry
	if retry != 0 {
		b.retryAt = time.Now().Add(b.w.g.spec.Retry.Delay(attempt))
	}
	return ok
}

// finishHeld delivers what the worker holds, in batches, for a worker that
// stopped, while nothing holds the slot. It stops at a record left waiting
// out a retry; the rest is then given back.
func (b *batchRun) finishHeld() {
	s := b.w.s
	for len(b.buf) > 0 {
		n := deliverable(b.buf, 0, b.w.m.batch.MaxSize)
		s.mu.Lock()
		if s.holds > 0 || s.epoch != b.epoch {
			s.mu.Unlock()
			return
		}
		revoked := s.startLocked()
		s.mu.Unlock()
		ok := b.deliverNext(n, revoked)
		s.setPhase(parked)
		if b.retry != 0 || !ok {
			return
		}
	}
}

// gate waits while the slot is held, keeping the held records alive on
// the server; it drops them when a reset made them moot and takes a
// record the previous local worker kept. It returns true with s.mu held
// when the worker may go on, false (without it) when it must stop.
func (b *batchRun) gate() bool {
	w, s := b.w, b.w.s
	keep := keeper{every: w.g.e.cfg.ackWait / 3}
	defer keep.stop()
	s.mu.Lock()
	for {
		if s.epoch != b.epoch { // the consumer was reset: what was fetched before is moot
			b.buf, b.retry, b.epoch = nil, 0, s.epoch
		}
		if msg := s.pending; msg != nil && !isRedriven(msg) { // a redriven one is redriveStep's
			if md, err := msg.Metadata(); err == nil && s.pendingEpoch == s.epoch {
				b.buf = insertHeld(b.buf, held{msg: msg, seq: md.Sequence.Stream, md: md})
			}
			s.pending = nil
		}
		if w.stopping() {
			s.setPhaseLocked(parked)
			s.mu.Unlock()
			return false
		}
		if s.holds == 0 {
			s.renewRevokedLocked()
			return true
		}
		if len(b.buf) == 0 {
			s.setPhaseLocked(parked)
		} else {
			s.setPhaseLocked(holding)
			keep.start()
		}
		if s.waitLocked(w.stop, keep.ticks()) {
			s.mu.Unlock()
			b.keepAlive()
			s.mu.Lock()
		}
	}
}

// insertHeld puts h into buf in stream order; a record already there is
// replaced (the server delivered it again: the newer delivery is the live
// one).
func insertHeld(buf []held, h held) []held {
	i, found := slices.BinarySearchFunc(buf, h.seq, func(x held, seq uint64) int { return cmp.Compare(x.seq, seq) })
	if found {
		buf[i] = h
		return buf
	}
	return slices.Insert(buf, i, h)
}

// deliverable returns how many records from the front of buf form the
// next batch: none while a failed record (retry) has not come back; one
// for a record delivered more than once; else consecutive first
// deliveries, at most max.
func deliverable(buf []held, retry uint64, max int) int {
	switch {
	case len(buf) == 0:
		return 0
	case retry != 0:
		if buf[0].seq == retry {
			return 1
		}
		return 0
	case buf[0].md.NumDelivered > 1:
		return 1
	}
	n := 1
	for n < len(buf) && n < max && buf[n].seq == buf[n-1].seq+1 && buf[n].md.NumDelivered == 1 {
		n++
	}
	return n
}

// retryGone reports whether the failed record waiting to come back is no
// longer in the stream.
func (b *batchRun) retryGone() bool {
	w := b.w
	ctx, cancel := w.g.e.ctx()
	defer cancel()
	_, err := w.g.t.streams[w.s.p].GetMsg(ctx, b.retry)
	return errors.Is(err, natsjs.ErrMsgNotFound)
}

// fetch pulls up to n records with one pull answered at once with what
// the server has (no_wait), after waiting up to the poll wait for the
// first; then, with topUp and MaxWait set, it pulls what comes within
// MaxWait of the first, up to n. Each pull is read to its end, so no
// answer of it is left for the next.
func (b *batchRun) fetch(n int, topUp bool) ([]held, error) {
	w := b.w
	p, err := w.puller()
	if err != nil {
		return nil, err
	}
	// The answers must fit in the puller's buffer, with a status or two
	// (newPuller): a puller a per-record member of the group made first
	// buffers fewer than a batch, and then batches are that much smaller.
	n = max(1, min(n, cap(p.in)-len(p.in)-pullerRoom/2))
	if err := p.pullN(n, w.g.e.cfg.pollWait, true); err != nil {
		return nil, err
	}
	abort := w.g.e.handlerCtx.Done()
	var got []held
	read := func(want int, wait time.Duration) error {
		for range want {
			msg, err := p.next(abort, wait+time.Second)
			if msg == nil {
				return err
			}
			md, err := msg.Metadata()
			if err != nil {
				_ = msg.Nak()
				continue
			}
			got = append(got, held{msg: msg, seq: md.Sequence.Stream, md: md})
		}
		return nil
	}
	if err := read(n, w.g.e.cfg.pollWait); err != nil || len(got) == 0 {
		return got, err
	}
	if mw := w.m.batch.MaxWait; topUp && mw > 0 {
		deadline := time.Now().Add(mw)
		for len(got) < n && !w.stopping() {
			left := time.Until(deadline)
			if left < time.Millisecond {
				break
			}
			want := n - len(got)
			if err := p.pullN(want, left, false); err != nil {
				break
			}
			if err := read(want, left); err != nil {
				break
			}
		}
	}
	return got, nil
}

// deliver runs the handler on hs, consecutive first deliveries (or one
// record), and settles the outcome. It returns how many records of hs
// were settled (acked, dead-lettered or sent back to retry), the sequence
// of a record now waiting out its backoff (0 when none) and the attempt
// that failed, and false when the worker must exit (Close gave up on the
// batch: nothing is acked).
func (b *batchRun) deliver(hs []held, revoked <-chan struct{}) (settled int, retry uint64, attempt int, ok bool) {
	w := b.w
	g, s := w.g, w.s
	recs := make([]*engine.Record, 0, len(hs))
	ids := make([]string, 0, len(hs))
	for _, h := range hs {
		rec, err := decodeOrRaw(h.msg.Headers(), h.msg.Data(), h.seq, h.md.Timestamp)
		if err != nil {
			if len(recs) > 0 {
				break // delivered after the records before it, alone
			}
			// Undecodable: a dead letter at once, as in the per-record path.
			d := &engine.Delivery{Topic: g.t.name, Partition: s.p, ID: w.recordID(h.seq),
				Record: rec, Attempt: int(h.md.NumDelivered), Revoked: revoked}
			w.noteStart(h.seq, d.Attempt)
			s.ended(false)
			if w.settle(h.msg, d, undecodable(err)) {
				return 1, h.seq, d.Attempt, true
			}
			return 1, 0, 0, true
		}
		recs = append(recs, rec)
		ids = append(ids, w.recordID(h.seq))
	}
	hs = hs[:len(recs)]
	attempt = int(hs[0].md.NumDelivered)
	batch := &engine.Batch{Topic: g.t.name, Partition: s.p, Records: recs, IDs: ids, Attempt: attempt, Revoked: revoked}
	w.noteStart(hs[0].seq, attempt)
	msgs := make([]record, len(hs))
	for i, h := range hs {
		msgs[i] = h.msg
	}
	stopKeep := w.keepAlive(msgs...)
	done, failed := kit.Outcome(w.callBatch(batch), len(hs))
	stopKeep()
	s.ended(failed != nil && kit.Judge(failed, attempt, g.spec.Retry.MaxAttempts) == kit.Retry)
	if g.e.handlerCtx.Err() != nil {
		return 0, 0, 0, false // Close gave up on this batch: nothing is committed
	}
	if done > 0 {
		// Counted, and next moved, before the acks, which Drain may see.
		g.counts.delivered.Add(int64(done))
		s.settledTo(hs[done-1].seq)
		for _, h := range hs[:done-1] {
			_ = h.msg.Ack()
		}
		ctx, cancel := g.e.ctx()
		_ = hs[done-1].msg.DoubleAck(ctx) // acks are taken in order: the last confirms them all
		cancel()
		g.e.committed()
	}
	if failed == nil {
		return done, 0, 0, true
	}
	h := hs[done]
	d := &engine.Delivery{Topic: g.t.name, Partition: s.p, ID: ids[done], Record: recs[done], Attempt: attempt, Revoked: revoked}
	if w.settle(h.msg, d, failed) {
		return done + 1, h.seq, attempt, true
	}
	return done + 1, 0, 0, true
}
