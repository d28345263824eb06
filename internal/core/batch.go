package core

import (
	"time"

	"github.com/logbus/logbus/internal/kit"
)

// This file is the worker's loop for a batch consumer (a member with a
// BatchHandler). It keeps every rule of the per-record loop in worker.go —
// one worker per (group, partition), records in offset order, a commit only
// after the handler returned — and changes only how many records one call
// and one commit cover:
//
//   - A batch is what one read finds (everything appended since the last
//     look, up to MaxSize), topped up for at most MaxWait when MaxWait is
//     set.
//   - A batch that returns nil is committed in one compare-and-set.
//   - A failure names a record (BatchError.Index, else the first). The
//     records before it are committed; the failed one is retried alone,
//     with the per-record path's backoff, attempt count and dead letter,
//     and the records after it wait for it: they form the next batch once
//     it is settled. A record whose attempt is above 1 is always delivered
//     alone, so Batch.Attempt holds for every record of a batch.

// runBatches is run for a batch consumer.
func (w *worker) runBatches() {
	part, cursor := w.gp.part, w.gp.cursor
	for !w.stopping() {
		if w.gp.redrive.pending.Load() > 0 { // dead letters sent back (Redrive) come first, one by one
			if !w.redeliver() {
				return
			}
			continue
		}
		offset := cursor.Committed()
		w.fit(part.End() - offset)
		n, skipTo, waiting := part.Read(offset, w.recs, cursor, w.bell)
		switch {
		case skipTo > offset:
			_ = w.skip(offset, skipTo)
			continue
		case waiting:
			select {
			case <-w.bell:
			case <-w.stop:
				return
			}
			continue
		}
		if n < w.limit && w.m.spec.MaxWait > 0 {
			var more bool
			if n, more = w.topUp(offset, n); !more {
				clear(w.recs[:n])
				return
			}
		}
		w.readEnd = offset + int64(n)
		if !w.deliverBatches(w.recs[:n]) {
			return
		}
	}
}

// topUp reads more records into w.recs, which holds n from offset on, until
// the batch is full or MaxWait has passed since the first was read. It
// reports false when the worker was stopped meanwhile: nothing was
// delivered, and the records are read again by whoever serves the
// partition next.
func (w *worker) topUp(offset int64, n int) (int, bool) {
	part, cursor := w.gp.part, w.gp.cursor
	if w.wait == nil {
		w.wait = time.NewTimer(w.m.spec.MaxWait)
	} else {
		w.wait.Reset(w.m.spec.MaxWait)
	}
	defer w.wait.Stop()
	for n < w.limit {
		w.fit(max(part.End()-offset, int64(n)+1)) // room for what is there, and one more to wait for
		m, _, waiting := part.Read(offset+int64(n), w.recs[n:], cursor, w.bell)
		switch {
		case m > 0:
			n += m
			continue
		case !waiting:
			// Retention trimmed what was read: deliver it, and the
			// delivery finds it gone, skips and counts it.
			return n, !w.stopping()
		}
		select {
		case <-w.bell:
		case <-w.wait.C:
			// When stop was closed at the same time, select may have
			// picked either: a stopped worker begins no delivery.
			return n, !w.stopping()
		case <-w.stop:
			return n, false
		}
	}
	return n, !w.stopping()
}

// fit makes room in w.recs (and w.ids) for want records, at least one and
// at most w.limit, keeping the records it holds. The slots grow with what
// the partition has had to deliver at once, not with the batch size: a
// consumer of WithBatchSize(4096) on 16,384 partitions allocated 4096
// slots per partition when it subscribed, 1.56 GiB, whether records came
// or not. They grow by doubling, so a worker allocates O(log limit) times
// in its life, on a read that finds more records than ever before; a
// read costs a comparison more.
func (w *worker) fit(want int64) {
	if want <= int64(len(w.recs)) && len(w.recs) > 0 || len(w.recs) == w.limit {
		return
	}
	n := min(max(int(min(want, int64(w.limit))), 2*len(w.recs), 1), w.limit)
	recs := make([]*Record, n)
	copy(recs, w.recs)
	w.recs, w.ids = recs, make([]string, n)
}

// deliverBatches delivers recs, consecutive records of the partition, in
// batches as the file comment says. It reports false when the worker must
// exit.
func (w *worker) deliverBatches(recs []*Record) bool {
	defer clear(recs) // drop the references so trimmed records can be freed
	gp, cursor := w.gp, w.gp.cursor
	for len(recs) > 0 {
		first := recs[0].Offset
		// Trimming takes the oldest record first, so if the first is still
		// retained so are the others (when the call begins; see deliver).
		if gp.part.trimsUnread && first < gp.part.trimmedBelow() {
			gp.retryOffset, gp.attempts = -1, 0
			return true // the next read finds the cursor trimmed, skips and counts
		}
		batch, attempt := recs, 1
		if gp.retryOffset == first {
			batch, attempt = recs[:1], gp.attempts+1 // a retry goes alone
		}
		gp.retryOffset, gp.attempts = first, attempt
		gp.setState(InFlight)
		done, failed := kit.Outcome(w.callBatch(batch, attempt), len(batch))
		if done > 0 {
			// Shown before the commit, which may wake Drain.
			gp.acks += uint64(done)
			gp.setState(Acked)
			next := first + int64(done)
			if !cursor.Commit(first, next) {
				// Close sealed the cursor while the handler ran: nothing
				// of the batch counts as delivered (see deliverBatch).
				gp.acks -= uint64(done)
				gp.setState(Pending)
				return false
			}
			recs = recs[done:]
			if failed != nil {
				// The failed record was on its first attempt: only a
				// batch of one is a retry.
				gp.retryOffset, gp.attempts = recs[0].Offset, 1
			} else {
				gp.retryOffset, gp.attempts = -1, 0
			}
			w.committed(next)
		}
		if failed == nil {
			if w.stopping() {
				return false
			}
			continue
		}
		if !w.settleFailed(recs[0], failed) {
			return false
		}
		if gp.retryOffset == -1 { // dead-lettered and committed
			recs = recs[1:]
		}
		if w.stopping() {
			return false
		}
	}
	return true
}

// settleFailed handles the failure of rec, the record at gp.retryOffset,
// on attempt gp.attempts: it dead-letters and commits it, or waits out the
// backoff before its retry. It reports false when the worker must exit.
func (w *worker) settleFailed(rec *Record, err error) bool {
	gp, g := w.gp, w.g
	attempt := gp.attempts
	switch v := kit.Judge(err, attempt, g.spec.Retry.MaxAttempts); {
	case v == kit.NotDelivered:
		gp.attempts = attempt - 1 // it never happened
		return false
	case v == kit.Abandoned, g.broker.handlerCtx.Err() != nil:
		return false // no commit: the record is delivered again later
	case v == kit.DeadLetter:
		w.park(rec, w.recordID(rec), attempt, err)
		next := rec.Offset + 1
		if !gp.cursor.Commit(next-1, next) {
			return false
		}
		w.committed(next)
		return true
	}
	return w.backoff(rec, attempt, err)
}

// callBatch runs the batch handler on recs (kit.Call: a panic becomes a
// *PanicError). The Batch it hands over is the worker's own, refilled per
// call: the handler may not keep it.
func (w *worker) callBatch(recs []*Record, attempt int) error {
	b := &w.batch
	b.Records, b.IDs, b.Attempt = recs, w.ids[:len(recs)], attempt
	if ids := w.gp.part.ids; ids != nil {
		ids.fill(recs[0].Offset, b.IDs) // the records are consecutive
	} else {
		for i, rec := range recs {
			b.IDs[i] = rec.ID
		}
	}
	return kit.Call(w.ctx, w.m.batch, b)
}
