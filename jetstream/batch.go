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
	"errors"
	"fmt"
	"slices"
	"strconv"
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

// setMaxAckPending makes partition p's consumer allow n records unacked,
// when it does not already. The server takes a whole configuration, so
// the one it has is read and sent back changed: cfgMu keeps this broker's
// Pause and Resume out meanwhile (a Pause by another broker in between
// would be undone: a narrow window when a worker starts).
func (g *group) setMaxAckPending(p, n int) error {
	g.cfgMu.Lock()
	defer g.cfgMu.Unlock()
	ctx, cancel := g.e.ctx()
	defer cancel()
	info, err := g.consumers[p].Info(ctx)
	if err != nil {
		return err
	}
	if info.Config.MaxAckPending == n {
		return nil
	}
	cfg := info.Config
	cfg.MaxAckPending = n
	_, err = g.e.js.UpdateConsumer(ctx, g.e.names.stream(g.t.name, p), cfg)
	return err
}

// runBatches is run for a batch consumer.
func (w *worker) runBatches() {
	s, g := w.s, w.g
	raised := false // MaxAckPending is the batch size
	var buf []held  // fetched, unsettled, in stream order
	var retry uint64
	var retryAt time.Time // when the server delivers retry again
	s.mu.Lock()
	epoch := s.epoch
	s.mu.Unlock()
	defer func() {
		// Given back, to come again at once with the same attempt
		// (giveBack). When a failed record waits out its backoff they wait
		// behind it, so that it still goes first: then they come again
		// counted as one more attempt (the server counts deliveries).
		if retry == 0 {
			msgs := make([]record, len(buf))
			for i, h := range buf {
				msgs[i] = h.msg
			}
			g.giveBack(s, epoch, msgs...)
			return
		}
		delay := time.Until(retryAt) + g.e.cfg.pollWait
		for _, h := range buf {
			if delay > 0 {
				_ = h.msg.NakWithDelay(delay)
			} else {
				_ = h.msg.Nak()
			}
		}
	}()
	lastKeep := time.Now()
	for {
		if !raised {
			raised = g.setMaxAckPending(s.p, w.m.batch.MaxSize) == nil
		}
		if len(buf) > 0 && time.Since(lastKeep) > g.e.cfg.ackWait/3 {
			// Records held while a failed one waits out its backoff.
			for _, h := range buf {
				_ = h.msg.InProgress()
			}
			lastKeep = time.Now()
		}
		if !w.batchGate(&buf, &epoch, &retry) {
			if len(buf) > 0 && retry == 0 && g.nextOwner(w) == ownerRemote {
				// As the per-record worker does with a record it holds: the
				// partition goes to another broker (or this one is closing),
				// so what was fetched is delivered here, as deliveries in
				// flight, rather than given back with an attempt more.
				retry, retryAt = w.finishHeld(&buf, epoch)
			}
			return
		}
		// s.mu is held.
		if len(buf) == 0 && retry == 0 && (s.wantsRedrive() || s.pending != nil) {
			// Redriven dead letters go before the records not read yet, as
			// batches of one.
			s.mu.Unlock()
			w.redriveStep()
			continue
		}
		if n := deliverable(buf, retry, w.m.batch.MaxSize); n > 0 {
			s.phase = busy
			s.signal()
			revoked := s.revoked
			s.mu.Unlock()
			var settled int
			var ok bool
			var failedAttempt int
			settled, retry, failedAttempt, ok = w.deliverBatch(buf[:n], revoked)
			buf = slices.Delete(buf, 0, settled)
			if retry != 0 {
				retryAt = time.Now().Add(g.spec.Retry.Delay(failedAttempt))
			}
			if !ok {
				return
			}
			s.setPhase(parked)
			continue
		}
		s.phase = fetching
		s.signal()
		s.mu.Unlock()
		n := w.m.batch.MaxSize - len(buf)
		if retry != 0 || n < 1 || !raised {
			n = 1
		}
		got, err := w.fetchBatch(n, retry == 0)
		s.setPhase(parked)
		g.pullFailed(err)
		for _, h := range got {
			buf = insertHeld(buf, h)
		}
		if len(got) == 0 && retry != 0 && len(buf) > 0 && w.retryGone(retry) {
			retry = 0 // retention took it while it waited: the partition moves on
		}
		if err != nil && len(got) == 0 && !w.pause(g.e.cfg.pollWait) {
			return
		}
	}
}

// finishHeld delivers buf, in batches, for a worker that stopped, while
// nothing holds the slot. It returns a record left waiting out a retry,
// and when it is due; the rest of buf is then given back.
func (w *worker) finishHeld(buf *[]held, epoch uint64) (uint64, time.Time) {
	s := w.s
	for len(*buf) > 0 {
		n := deliverable(*buf, 0, w.m.batch.MaxSize)
		s.mu.Lock()
		if s.holds > 0 || s.epoch != epoch {
			s.mu.Unlock()
			return 0, time.Time{}
		}
		s.phase = busy
		s.signal()
		revoked := s.revoked
		s.mu.Unlock()
		settled, retry, attempt, ok := w.deliverBatch((*buf)[:n], revoked)
		*buf = slices.Delete(*buf, 0, settled)
		s.setPhase(parked)
		if retry != 0 {
			return retry, time.Now().Add(w.g.spec.Retry.Delay(attempt))
		}
		if !ok {
			break
		}
	}
	return 0, time.Time{}
}

// batchGate waits while the slot is held, keeping buf alive on the server;
// it drops buf when a reset made it moot and takes a record the previous
// local worker kept. It returns true with s.mu held when the worker may go
// on, false (without it) when it must stop.
func (w *worker) batchGate(buf *[]held, epoch, retry *uint64) bool {
	s := w.s
	var keep *time.Ticker
	defer func() {
		if keep != nil {
			keep.Stop()
		}
	}()
	s.mu.Lock()
	for {
		if s.epoch != *epoch { // the consumer was reset: what was fetched before is moot
			*buf, *retry, *epoch = nil, 0, s.epoch
		}
		if msg := s.pending; msg != nil && !isRedriven(msg) { // a redriven one is redriveStep's
			if md, err := msg.Metadata(); err == nil && s.pendingEpoch == s.epoch {
				*buf = insertHeld(*buf, held{msg: msg, seq: md.Sequence.Stream, md: md})
			}
			s.pending = nil
		}
		if w.stopping() {
			s.phase = parked
			s.signal()
			s.mu.Unlock()
			return false
		}
		if s.holds == 0 {
			select { // a revocation is spent once its hold ended: a fresh one
			case <-s.revoked:
				s.revoked = make(chan struct{})
			default:
			}
			return true
		}
		s.phase = parked
		if len(*buf) > 0 {
			s.phase = holding
		}
		s.signal()
		ch := s.changed
		s.mu.Unlock()
		if len(*buf) > 0 && keep == nil {
			keep = time.NewTicker(w.g.e.cfg.ackWait / 3)
		}
		var tick <-chan time.Time
		if keep != nil {
			tick = keep.C
		}
		select {
		case <-ch:
		case <-w.stop:
		case <-tick:
			for _, h := range *buf {
				_ = h.msg.InProgress()
			}
		}
		s.mu.Lock()
	}
}

// insertHeld puts h into buf in stream order; a record already there is
// replaced (the server delivered it again: the newer delivery is the live
// one).
func insertHeld(buf []held, h held) []held {
	i, found := slices.BinarySearchFunc(buf, h.seq, func(x held, seq uint64) int {
		switch {
		case x.seq < seq:
			return -1
		case x.seq > seq:
			return 1
		}
		return 0
	})
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

// retryGone reports whether the record at seq, which failed and waits to
// come back, is no longer in the stream.
func (w *worker) retryGone(seq uint64) bool {
	ctx, cancel := w.g.e.ctx()
	defer cancel()
	_, err := w.g.t.streams[w.s.p].GetMsg(ctx, seq)
	return errors.Is(err, natsjs.ErrMsgNotFound)
}

// puller returns the partition's puller, making it on first use.
func (w *worker) puller() (*puller, error) {
	return w.pullerOf(&w.s.puller, func() (string, string) {
		return w.g.e.names.stream(w.g.t.name, w.s.p), w.g.e.names.consumer(w.g.name, w.s.p)
	})
}

// pullerOf returns the puller in *field, one of the slot's (guarded by
// its mu), making it on first use on the stream and consumer names gives.
func (w *worker) pullerOf(field **puller, names func() (stream, consumer string)) (*puller, error) {
	s := w.s
	s.mu.Lock()
	p := *field
	s.mu.Unlock()
	if p != nil {
		return p, nil
	}
	stream, consumer := names()
	p, err := newPuller(w.g.e.js, stream, consumer)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	*field = p
	s.mu.Unlock()
	return p, nil
}

// batchPull is one open pull for up to n records, answered at once with
// what the server has (no_wait), after waiting up to the poll wait for the
// first.
type batchPull struct {
	p   *puller
	err error
	n   int
}

// openBatch opens a pull for up to n records.
func (w *worker) openBatch(n int) *batchPull {
	p, err := w.puller()
	if err != nil {
		return &batchPull{err: err}
	}
	return &batchPull{p: p, n: n, err: p.pullN(n, w.g.e.cfg.pollWait, true)}
}

// fetchBatch pulls up to n records: what the server has at once, after
// waiting up to the poll wait for the first; then, with topUp and MaxWait
// set, what comes within MaxWait of the first, up to n.
func (w *worker) fetchBatch(n int, topUp bool) ([]held, error) {
	return w.collectBatch(w.openBatch(n), topUp)
}

// collectBatch reads bp's answers, then tops the batch up as fetchBatch
// says. Each pull is read to its end, so no answer of it is left for the
// next.
func (w *worker) collectBatch(bp *batchPull, topUp bool) ([]held, error) {
	if bp.err != nil {
		return nil, bp.err
	}
	p := bp.p
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
	if err := read(bp.n, w.g.e.cfg.pollWait); err != nil || len(got) == 0 {
		return got, err
	}
	if mw := w.m.batch.MaxWait; topUp && mw > 0 {
		deadline := time.Now().Add(mw)
		for len(got) < bp.n && !w.stopping() {
			left := time.Until(deadline)
			if left < time.Millisecond {
				break
			}
			want := bp.n - len(got)
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

// deliverBatch runs the handler on hs, consecutive first deliveries (or
// one record), and settles the outcome. It returns how many records of hs
// were settled (acked, dead-lettered or sent back to retry), the sequence
// of a record now waiting out its backoff (0 when none) and the attempt
// that failed, and false when the worker must exit (Close gave up on the
// batch: nothing is acked).
func (w *worker) deliverBatch(hs []held, revoked <-chan struct{}) (settled int, retry uint64, attempt int, ok bool) {
	g, s := w.g, w.s
	stream := g.t.streams[s.p].CachedInfo().Config.Name
	recs := make([]*engine.Record, 0, len(hs))
	ids := make([]string, 0, len(hs))
	for _, h := range hs {
		rec, err := decodeRecord(h.msg.Headers(), h.msg.Data(), h.seq, h.md.Timestamp)
		if err != nil {
			if len(recs) > 0 {
				break // delivered after the records before it, alone
			}
			// Undecodable: a dead letter at once, as in the per-record path.
			rec = &engine.Record{Offset: int64(h.seq) - 1, Value: h.msg.Data(), Created: h.md.Timestamp}
			d := &engine.Delivery{Topic: g.t.name, Partition: s.p, ID: stream + "-" + strconv.FormatUint(h.seq, 10),
				Record: rec, Attempt: int(h.md.NumDelivered), Revoked: revoked}
			w.noteStart(h.seq, d.Attempt)
			w.noteEnd(false)
			if w.settle(h.msg, d, fmt.Errorf("%w: %v", engine.ErrPermanent, err)) {
				return 1, h.seq, d.Attempt, true
			}
			return 1, 0, 0, true
		}
		recs = append(recs, rec)
		ids = append(ids, stream+"-"+strconv.FormatUint(h.seq, 10))
	}
	hs = hs[:len(recs)]
	attempt = int(hs[0].md.NumDelivered)
	b := &engine.Batch{Topic: g.t.name, Partition: s.p, Records: recs, IDs: ids, Attempt: attempt, Revoked: revoked}
	w.noteStart(hs[0].seq, attempt)
	msgs := make([]record, len(hs))
	for i, h := range hs {
		msgs[i] = h.msg
	}
	stopKeep := w.keepAlive(msgs...)
	done, failed := kit.Outcome(w.callBatch(b), len(hs))
	stopKeep()
	w.noteEnd(failed != nil && kit.Judge(failed, attempt, g.spec.Retry.MaxAttempts) == kit.Retry)
	if g.e.handlerCtx.Err() != nil {
		return 0, 0, 0, false // Close gave up on this batch: nothing is committed
	}
	if done > 0 {
		// Counted, and next moved, before the acks, which Drain may see.
		g.delivered.Add(int64(done))
		s.mu.Lock()
		s.next = hs[done-1].seq + 1
		s.mu.Unlock()
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

// noteStart records, for the snapshot and the skip count, that a delivery
// from stream sequence seq begins.
func (w *worker) noteStart(seq uint64, attempt int) {
	g, s := w.g, w.s
	s.mu.Lock()
	var skippedFrom uint64
	if s.next != 0 && seq > s.next {
		skippedFrom = s.next
		g.skipped.Add(int64(seq - s.next))
	}
	s.next = seq
	s.beginLocked(int64(seq)-1, attempt, w.m.name)
	s.mu.Unlock()
	if obs := g.e.obs; obs != nil && skippedFrom != 0 {
		obs.Observe(&engine.Event{Kind: engine.EventSkip, Topic: g.t.name, Group: g.name,
			Partition: s.p, Offset: int64(skippedFrom) - 1, To: int64(seq) - 1})
	}
}

// beginLocked records, for the snapshot and the stuck watchdog, that
// consumer's delivery of the record at offset begins, on attempt. s.mu is
// held.
func (s *slot) beginLocked(offset int64, attempt int, consumer string) {
	s.inFlight, s.retrying, s.attempt = true, false, attempt
	s.starts, s.offset, s.consumer = s.starts+1, offset, consumer
}

// noteEnd records that the delivery ended, and whether its failed record
// will be retried.
func (w *worker) noteEnd(retrying bool) {
	w.s.mu.Lock()
	w.s.inFlight, w.s.retrying = false, retrying
	w.s.mu.Unlock()
}

// callBatch runs the member's batch handler (kit.Call: a panic becomes a
// *PanicError).
func (w *worker) callBatch(b *engine.Batch) error {
	return kit.Call(w.g.e.handlerCtx, w.m.bh, b)
}
