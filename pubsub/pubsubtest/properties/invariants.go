package properties

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing/synctest"
	"time"

	"pgregory.net/rapid"

	"github.com/logbus/logbus/pubsub"
)

// Check runs after every action, once the system is quiet.
func (m *machine) Check(t *rapid.T) {
	synctest.Wait()
	m.mu.Lock()
	violations := slices.Clone(m.violations)
	m.mu.Unlock()
	if len(violations) > 0 {
		for _, v := range violations {
			t.Log(v)
		}
		t.Fatalf("%d violations, first: %s", len(violations), violations[0])
	}
	m.checkCalls(t)
	m.foldHistory()
	m.checkDeadLetters(t)
	m.checkCommits(t)
	m.checkAccounting(t)
	m.checkTopicStats(t)
}

// foldHistory attributes the dead letters of records that cannot be
// decoded, which no consumer ever sees, to the current epoch of their
// partition. That is exact: such a record is dead-lettered at once, so the
// system being quiet means it is done, and every repositioning folds
// first. The dead letters of records a consumer saw are accounted where
// that delivery is (checkCalls: its final failure).
func (m *machine) foldHistory() {
	for _, group := range slices.Sorted(maps.Keys(m.groups)) {
		letters := m.groups[group].DeadLetters()
		m.mu.Lock()
		for _, l := range letters[m.seenDead[group]:] {
			pos := pubsub.Position{Partition: l.Message.Partition, Offset: l.Message.Offset}
			if m.bySeq[m.byPos[pos]].job.Fault == faultUndecodable {
				eps := m.epochs[gp{group, l.Message.Partition}]
				eps[len(eps)-1].dead[l.Message.Offset]++
				m.wantLetterLocked(group, letter{l.Message.Partition, l.Message.Offset, 1, "decode"})
			}
		}
		m.seenDead[group] = len(letters)
		m.mu.Unlock()
	}
}

func (m *machine) wantLetterLocked(group string, l letter) {
	if m.wantLetters[group] == nil {
		m.wantLetters[group] = map[letter]int{}
	}
	m.wantLetters[group][l]++
}

// letterOf is what a dead letter says, as the model writes it: the kind is
// derived from the letter's error, and is "unexplained" when the error is
// not the one the record's last attempt failed with.
func (m *machine) letterOf(l pubsub.DeadLetter[job]) letter {
	pos := pubsub.Position{Partition: l.Message.Partition, Offset: l.Message.Offset}
	seq, ok := m.byPos[pos]
	_, isDecode := errors.AsType[*pubsub.DecodeError](l.Err)
	_, isPanic := errors.AsType[*pubsub.PanicError](l.Err)
	ne, isNack := errors.AsType[*nackError](l.Err)
	kind := "unexplained"
	switch {
	case !ok:
	case isDecode:
		if errors.Is(l.Err, errUndecodable) && errors.Is(l.Err, pubsub.ErrPermanent) {
			kind = "decode"
		}
	case l.Message.Value.Seq != seq:
		kind = fmt.Sprintf("carrying seq %d", l.Message.Value.Seq)
	case isPanic:
		kind = "panic"
	case isNack:
		if ne.seq == seq && ne.attempt == l.Attempts && errors.Is(l.Err, pubsub.ErrPermanent) == ne.permanent {
			kind = "transient"
			if ne.permanent {
				kind = "permanent"
			}
		}
	case l.Err != nil && !errors.Is(l.Err, pubsub.ErrPermanent):
		kind = "nacked"
	}
	return letter{l.Message.Partition, l.Message.Offset, l.Attempts, kind}
}

// checkDeadLetters: invariant 8. Each group's dead letters are exactly the
// ones its history explains: a record that cannot be decoded, after one
// attempt; a delivery that failed for good, after the attempts it made,
// with the error it failed with. The group counts them in DeadLettered.
func (m *machine) checkDeadLetters(t *rapid.T) {
	for _, group := range slices.Sorted(maps.Keys(m.groups)) {
		g := m.groups[group]
		letters := g.DeadLetters()
		got := map[letter]int{}
		for _, l := range letters {
			got[m.letterOf(l)]++
		}
		m.mu.Lock()
		want := maps.Clone(m.wantLetters[group])
		m.mu.Unlock()
		if !maps.Equal(got, want) {
			for l := range maps.Keys(got) {
				if got[l] != want[l] {
					t.Logf("+ %s p%d@%d after %d attempts (%s): %d, want %d", group, l.partition, l.offset, l.attempts, l.kind, got[l], want[l])
				}
			}
			for l := range maps.Keys(want) {
				if _, ok := got[l]; !ok {
					t.Logf("- %s p%d@%d after %d attempts (%s): none, want %d", group, l.partition, l.offset, l.attempts, l.kind, want[l])
				}
			}
			t.Fatalf("dead letters: %s holds dead letters its history does not explain (-want +got in the log)", group)
		}
		if n := g.Stats().DeadLettered; n != int64(len(letters)) {
			t.Fatalf("accounting: %s holds %d dead letters but counted %d dead-lettered", group, len(letters), n)
		}
	}
}

// checkCalls walks the deliveries not seen yet:
//   - invariant 1: each carries the record published at its position, with
//     the Created the model stamped;
//   - invariant 2: no record whose publish failed is ever delivered;
//   - invariant 3: within an epoch, a partition's deliveries never go back
//     to an earlier offset, and never begin before the epoch's start (for
//     the first epoch, where the group's Start put it). (A delivery may
//     move on past a record without an outcome when retention evicted that
//     record while it waited for a retry; the accounting check holds such
//     a record to the group's Skipped count.) With key concurrency this
//     holds per key instead (per-key order), a keyless record being a key
//     of its own: records of different keys end in any order.
//   - invariant 6: every repeated delivery is explained: attempt n+1 of an
//     offset follows, in the same epoch, attempt n failed but not for
//     good, or given back after it was received. A delivery taken back
//     before anyone received it was none, and its attempt comes again.
func (m *machine) checkCalls(t *rapid.T) {
	m.mu.Lock()
	calls := slices.Clone(m.calls[m.seenCalls:])
	m.seenCalls = len(m.calls)
	closedAt := m.closedAt
	m.mu.Unlock()
	for _, c := range calls {
		pos := pubsub.Position{Partition: c.partition, Offset: c.offset}
		seq, ok := m.byPos[pos]
		if !ok || seq != c.seq {
			t.Fatalf("consistency: %v carries seq %d, but seq %d (found %v) was published there", c, c.seq, seq, ok)
		}
		if err, failed := m.failedSeq[c.seq]; failed {
			t.Fatalf("aborted read: %v delivers a record whose publish failed with %v", c, err)
		}
		if want := m.bySeq[seq].created; !c.created.Equal(want) {
			t.Fatalf("consistency: %v carries Created %v, but it was published at %v", c, c.created, want)
		}
		k := gp{c.group, c.partition}
		m.mu.Lock()
		e := m.epochs[k][c.epoch]
		m.mu.Unlock()
		if c.offset < e.start {
			t.Fatalf("start: %v delivers an offset before %d, where its epoch starts", c, e.start)
		}
		ke := orderKey{gpEpoch{k, c.epoch}, m.orderOf(c)}
		prev, hasPrev := m.lastCall[ke]
		switch {
		case !hasPrev || c.offset > prev.offset:
			if c.attempt != 1 {
				t.Fatalf("duplicates: %v is the first delivery of its offset in its epoch but has attempt %d", c, c.attempt)
			}
		case c.offset < prev.offset:
			t.Fatalf("order: %v went back from %v within an epoch", c, prev)
		default: // the same offset again
			again := prev.outcome == failed && !m.finalFailure(prev) || prev.outcome == givenBack
			if !again || c.attempt != prev.attempt+1 {
				t.Fatalf("duplicates: %v after %v is not explained by a retry or a give-back", c, prev)
			}
		}
		m.lastCall[ke] = c
		m.mu.Lock()
		switch {
		case c.outcome == acked && !closedAt.IsZero() && c.end.After(closedAt):
			m.lateAcks[c.group]++ // commits nothing: the cursor is sealed
		case c.outcome == acked:
			e.acked[c.offset]++
		case m.finalFailure(c):
			e.dead[c.offset]++
			m.wantLetterLocked(c.group, letter{c.partition, c.offset, c.attempt, c.kind})
		case c.outcome == failed:
			m.retried[c.group]++
		}
		m.mu.Unlock()
	}
}

// orderOf is what c's delivery is ordered within in its epoch (invariant
// 3): the whole partition, or with key concurrency its record's key.
func (m *machine) orderOf(c call) string {
	if m.starts[c.group].concurrency() == 1 {
		return ""
	}
	if key := m.bySeq[c.seq].key; key != "" {
		return "key " + key
	}
	return fmt.Sprintf("keyless %d", c.offset)
}

// checkCommits: invariant 7. Within an epoch a committed offset never moves
// backwards, and never past the end. Commits are contiguous: the committed
// offset never passes a retained record of the current epoch that is
// unsettled (in hand, or whose last delivery failed but not for good, or
// was given back), and, the system being quiet and Close not begun, it
// does not stop at a record that settled (acked or dead-lettered): it
// reaches the oldest unsettled record. With key concurrency that is what
// holds the window; without, it is the record in flight.
func (m *machine) checkCommits(t *rapid.T) {
	for group, g := range m.groups {
		for p := range m.partitions {
			k := gp{group, p}
			c := g.Committed(p)
			earliest, end, _ := m.topic.Offsets(p)
			if c < m.lastCommitted[k] || c > end {
				t.Fatalf("commits: %s partition %d committed %d, was %d, end %d", group, p, c, m.lastCommitted[k], end)
			}
			m.lastCommitted[k] = c
			m.mu.Lock()
			ep := m.epochIdx[k]
			e := m.epochs[k][ep]
			settled := e.acked[c]+e.dead[c] > 0
			inHand := slices.Clone(m.busy[k])
			closing := !m.closedAt.IsZero()
			m.mu.Unlock()
			for _, h := range inHand {
				if h.offset >= earliest && h.offset < c {
					t.Fatalf("commits: %s partition %d committed %d past p%d@%d, in hand", group, p, c, p, h.offset)
				}
			}
			for key, last := range m.lastCall {
				if key.gp == k && key.epoch == ep && last.offset >= earliest && last.offset < c &&
					(last.outcome == givenBack || last.outcome == failed && !m.finalFailure(last)) {
					t.Fatalf("commits: %s partition %d committed %d past %v, unsettled", group, p, c, last)
				}
			}
			if settled && c >= earliest && c < end && !closing {
				t.Fatalf("commits: %s partition %d stops at %d, which settled: the commit must reach the oldest unsettled record", group, p, c)
			}
		}
	}
}

// checkAccounting: invariants 5, 8 and 9. In every epoch of every (group,
// partition), each offset the cursor passed has at most one final outcome
// (one ack or one dead letter), every final outcome lies below the cursor
// (every ack is reflected in the committed offset), and the offsets the
// cursor passed without an outcome are exactly the ones the group counted
// as Skipped: nothing is lost silently. The group counts as Delivered
// exactly the acks that committed (an ack after Close returned commits
// nothing, and its record "counts as not delivered"), and as Retried
// exactly the failed attempts that were not the last.
func (m *machine) checkAccounting(t *rapid.T) {
	for group, g := range m.groups {
		var unexplained, acks int64
		for p := range m.partitions {
			k := gp{group, p}
			committed := g.Committed(p)
			m.mu.Lock()
			eps := slices.Clone(m.epochs[k])
			m.mu.Unlock()
			// With key concurrency a record may settle above the committed
			// offset, behind an unsettled one: it counts once the offset
			// passes it (as Delivered does), and a seek discards it.
			keyed := m.starts[group].concurrency() > 1
			for i, e := range eps {
				stop := e.stop // read with the group paused, nothing in flight (see quiesce)
				if !e.closed {
					stop = committed
				}
				finals := 0
				for off, n := range e.acked {
					if n+e.dead[off] > 1 || off < e.start || off >= stop && !keyed {
						t.Fatalf("at-least-once: %s p%d epoch %d [%d, %d): offset %d acked %d times and dead-lettered %d times",
							group, p, i, e.start, stop, off, n, e.dead[off])
					}
					if off < stop {
						finals++
						acks += int64(n)
					}
				}
				for off, n := range e.dead {
					if n > 1 || off < e.start || off >= stop && !keyed {
						t.Fatalf("dead letters: %s p%d epoch %d [%d, %d): offset %d dead-lettered %d times",
							group, p, i, e.start, stop, off, n)
					}
					if e.acked[off] == 0 && off < stop {
						finals++
					}
				}
				unexplained += stop - e.start - int64(finals)
			}
		}
		stats := g.Stats()
		m.mu.Lock()
		retried, late := m.retried[group], m.lateAcks[group]
		m.mu.Unlock()
		switch {
		case unexplained != stats.Skipped:
			t.Fatalf("accounting: %s passed %d offsets without an outcome but counted %d skipped", group, unexplained, stats.Skipped)
		// Delivered must be exactly the acks that committed: an ack after
		// Close returned commits nothing and its record "counts as not
		// delivered" (Broker.Close, Unfinished.Running;
		// TestLateAckAfterCloseCountsAsNotDelivered).
		case stats.Delivered != acks:
			t.Fatalf("accounting: %s's consumers acked %d times that committed (and %d after Close returned), but it counted %d delivered",
				group, acks, late, stats.Delivered)
		case retried != stats.Retried:
			t.Fatalf("accounting: %s's consumers failed %d attempts that were not the last, but it counted %d retried", group, retried, stats.Retried)
		}
	}
}

// checkTopicStats: invariant 9 for the topic. Every record that left the log
// is counted once, drops happen only under DropOldest or while no group is
// subscribed, expiry only with MaxAge, and every ErrBackpressure was
// counted.
func (m *machine) checkTopicStats(t *rapid.T) {
	s := m.topic.Stats()
	switch {
	case s.Published != int64(len(m.bySeq)):
		t.Fatalf("accounting: topic says %d published, the model %d", s.Published, len(m.bySeq))
	case s.Published-int64(s.Retained) != s.Reclaimed+s.Dropped+s.Expired:
		t.Fatalf("accounting: %+v: trimmed records not counted exactly once", s)
	case m.retention.OnFull != pubsub.DropOldest && len(m.groups) > 0 && s.Dropped != m.droppedGroupless:
		t.Fatalf("accounting: %+v: drops under Block after a group subscribed (%d before)", s, m.droppedGroupless)
	case s.Expired > 0 && m.retention.MaxAge == 0:
		t.Fatalf("accounting: %+v: expiry without MaxAge", s)
	case s.TimedOut != m.backpressured:
		t.Fatalf("accounting: %d publishes failed with ErrBackpressure, the topic counted %d", m.backpressured, s.TimedOut)
	}
	for p := range m.partitions {
		earliest, end, _ := m.topic.Offsets(p)
		if end-earliest > int64(m.retention.MaxMessages) {
			t.Fatalf("retention: partition %d holds %d records, more than %d", p, end-earliest, m.retention.MaxMessages)
		}
	}
}

func (m *machine) committedAll() map[gp]int64 {
	out := map[gp]int64{}
	for group, g := range m.groups {
		for p := range m.partitions {
			out[gp{group, p}] = g.Committed(p)
		}
	}
	return out
}

// closeAndCheck is invariant 10. Close, called from several goroutines at
// once, returns by its context's end plus the 10ms grace, stops everything
// (no goroutine is left), reports exactly the partitions left behind and
// those whose handler was still running, and afterwards every operation
// fails with ErrClosed. It is drawn to be one of two:
//
//   - a drain: the test settles what it holds, the member streams are
//     pumped, and Close gets an hour, so every group that can move must
//     finish;
//   - abrupt: Close gets at most 25.5ms while the test holds deliveries
//     and leaves others unread, so it gives up: held deliveries are given
//     back, and a handler still running when Close returns commits nothing.
//     Settling a delivery Close took back must change nothing either.
func (m *machine) closeAndCheck(t *rapid.T) {
	abrupt := rapid.Bool().Draw(t, "abruptClose")
	timeout := time.Hour + time.Millisecond/2 // half a millisecond off: see Timing in the file comment
	stopPumps := func() {}
	if abrupt {
		timeout = rapid.SampledFrom([]time.Duration{time.Millisecond / 2, 5*time.Millisecond + time.Millisecond/2,
			25*time.Millisecond + time.Millisecond/2}).Draw(t, "closeTimeout")
	} else {
		for _, h := range m.held("") {
			m.settle(h, m.drawSettlement(t, false))
		}
		stopPumps = m.pump()
	}
	defer stopPumps()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	start := time.Now()
	errs := make([]error, 3)
	var wg sync.WaitGroup
	for i := range errs {
		wg.Go(func() { errs[i] = m.b.Close(ctx) })
	}
	wg.Wait()
	took := time.Since(start)
	m.mu.Lock()
	m.closedAt = time.Now()
	running := map[gp]bool{} // the handlers in flight now are the ones Close left running
	for k, hs := range m.busy {
		for _, h := range hs {
			if !h.stream {
				running[k] = true
			}
		}
	}
	m.mu.Unlock()
	expired := ctx.Err() != nil
	switch {
	case took > timeout+closeGrace:
		t.Fatalf("close: Close took %v with a %v context; want at most %v more", took, timeout, closeGrace)
	case !abrupt && expired:
		t.Fatalf("close: with everything settled, Close did not finish within an hour: %v", errs[0])
	}
	// The first call's result, which later calls return (Close is
	// idempotent); a later call whose own context ends while it waits for
	// the first returns that context's error instead.
	// Equal results need not be one error value: compare what they say.
	result := m.b.Close(context.Background())
	same := func(a, b error) bool { return a == b || a != nil && b != nil && a.Error() == b.Error() }
	for _, err := range errs {
		_, isShutdown := errors.AsType[*pubsub.ShutdownError](err)
		if !same(err, result) && !(expired && errors.Is(err, context.DeadlineExceeded) && !isShutdown) {
			t.Fatalf("close: concurrent Close calls returned %v and %v", result, err)
		}
	}
	if !slices.ContainsFunc(errs, func(err error) bool { return same(err, result) }) {
		t.Fatalf("close: no concurrent Close call returned the result %v", result)
	}
	errs[0] = result
	if s := m.b.State(); s != pubsub.Stopped {
		t.Fatalf("close: state %v after Close", s)
	}

	var want []pubsub.Unfinished
	for _, group := range slices.Sorted(maps.Keys(m.groups)) {
		for p := range m.partitions {
			_, end, _ := m.topic.Offsets(p)
			if c, run := m.groups[group].Committed(p), running[gp{group, p}]; c < end || run {
				want = append(want, pubsub.Unfinished{Group: group, Topic: "jobs", Partition: p, Committed: c, End: end, Running: run})
			}
		}
	}
	se, isShutdown := errors.AsType[*pubsub.ShutdownError](errs[0])
	switch {
	case want == nil && errs[0] != nil:
		t.Fatalf("close: nothing was left but Close returned %v", errs[0])
	case want != nil && (!isShutdown || !slices.Equal(se.Unfinished, want)):
		t.Fatalf("close: returned %v, want a ShutdownError listing %+v", errs[0], want)
	case want != nil && expired && !errors.Is(errs[0], context.DeadlineExceeded):
		t.Fatalf("close: its context ended first, but it returned %v", errs[0])
	}
	if !expired {
		for _, u := range want {
			if len(m.members[u.Group]) > 0 && !m.paused[u.Group] {
				t.Fatalf("close: active group %s left partition %d at %d of %d", u.Group, u.Partition, u.Committed, u.End)
			}
		}
	}
	stopPumps() // the channels closed: the pumps are done

	// What Close left behind stays behind. It took back the deliveries the
	// test held: settling them now does nothing. A handler it left running
	// ends later and commits nothing.
	committed := m.committedAll()
	var takenBack []*pubsub.Delivery[job]
	for _, h := range m.held("") {
		takenBack = append(takenBack, h.d)
	}
	for _, st := range m.streams {
		m.giveBack(st)
	}
	for _, d := range takenBack {
		if rapid.Bool().Draw(t, "ackTakenBack") {
			d.Ack()
		} else {
			d.Nack(&nackError{seq: d.Value.Seq, attempt: d.Attempt})
		}
	}
	time.Sleep(time.Second) // virtual: every handler ends
	synctest.Wait()
	if now := m.committedAll(); !maps.Equal(now, committed) {
		t.Fatalf("close: offsets committed after Close returned: %v, then %v", committed, now)
	}
	for _, st := range m.streams {
		select {
		case d, ok := <-st.s.C():
			if ok {
				t.Fatalf("close: C of %s/%s delivered p%d@%d after Close", st.group, st.consumer, d.Partition, d.Offset)
			}
		default:
			t.Fatalf("close: C of %s/%s still open after Close", st.group, st.consumer)
		}
	}
	if left := bubbleLeftovers(); len(left) > 0 {
		for _, g := range left {
			t.Logf("left behind:\n%s", g)
		}
		t.Fatalf("close: %d goroutines outlived Close", len(left))
	}
	m.Check(t) // every ack that returned before Close is in the committed offsets
	m.checkTally(t)

	if _, err := m.topic.PublishValue(context.Background(), job{}); !errors.Is(err, pubsub.ErrClosed) {
		t.Fatalf("close: Publish after Close returned %v, want ErrClosed", err)
	}
	if _, err := m.topic.Subscribe("late", "c0", m.handler("late", "c0")); !errors.Is(err, pubsub.ErrClosed) {
		t.Fatalf("close: Subscribe after Close returned %v, want ErrClosed", err)
	}
	if _, err := m.topic.Stream("late", "c0"); !errors.Is(err, pubsub.ErrClosed) {
		t.Fatalf("close: Stream after Close returned %v, want ErrClosed", err)
	}
	for _, group := range slices.Sorted(maps.Keys(m.groups)) {
		g := m.groups[group]
		earliest, _, _ := m.topic.Offsets(0)
		for what, err := range map[string]error{
			"Seek":   g.Seek(context.Background(), 0, earliest),
			"Replay": g.Replay(context.Background(), pubsub.Earliest()),
			"Leave":  g.Leave(context.Background(), "c0"),
		} {
			if !errors.Is(err, pubsub.ErrClosed) {
				t.Fatalf("close: %s on %s after Close returned %v, want ErrClosed", what, group, err)
			}
		}
		if err := errors.Join(g.Pause(context.Background()), g.Resume(context.Background())); err != nil {
			t.Fatalf("close: Pause or Resume on %s after Close: %v, want nothing done", group, err)
		}
	}
}
