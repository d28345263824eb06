package properties

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing/synctest"
	"time"

	"pgregory.net/rapid"

	"github.com/logbus/logbus/pubsub"
)

func (m *machine) drawGroup(t *rapid.T) string {
	return rapid.SampledFrom([]string{"g0", "g1", "g2"}).Draw(t, "group")
}

func (m *machine) existingGroup(t *rapid.T) (string, *pubsub.Group[job]) {
	if len(m.groups) == 0 {
		t.Skip("no group yet")
	}
	name := rapid.SampledFrom(slices.Sorted(maps.Keys(m.groups))).Draw(t, "group")
	return name, m.groups[name]
}

// drawStart draws a Start: none (withNone), Earliest, Latest, AtOffset
// around the offsets in use, or AtTime at, just before or just after the
// Created of a record published so far, or long before or after all.
func (m *machine) drawStart(t *rapid.T, label string, withNone bool) startSpec {
	kinds := []string{"earliest", "latest", "offset", "offset", "time", "time"}
	if withNone {
		kinds = append([]string{"", "", ""}, kinds...)
	}
	s := startSpec{kind: rapid.SampledFrom(kinds).Draw(t, label)}
	switch s.kind {
	case "offset":
		s.offset = rapid.Int64Range(0, 12).Draw(t, label+"Offset")
	case "time":
		times := []time.Time{time.Now().Add(-time.Hour), time.Now().Add(time.Second)}
		for _, seq := range slices.Sorted(maps.Keys(m.bySeq)) {
			times = append(times, m.bySeq[seq].created)
		}
		at := rapid.SampledFrom(times).Draw(t, label+"Time")
		s.at = at.Add(rapid.SampledFrom([]time.Duration{-1, 0, 0, 1}).Draw(t, label+"Nudge"))
	}
	return s
}

// drawKeys draws a group's key concurrency: none (the default), 1 (the
// same), or a few deliveries of a partition at once.
func (m *machine) drawKeys(t *rapid.T, label string) int {
	return rapid.SampledFrom([]int{0, 0, 1, 2, 3}).Draw(t, label)
}

// resolve is where s starts in partition p as the model sees it: within
// the retained range, for AtTime the first retained record whose Created
// is not before s's time, in offset order (Created need not grow with the
// offset: a blocked publish reads the clock before it waits).
func (m *machine) resolve(s startSpec, p int) int64 {
	earliest, end, _ := m.topic.Offsets(p)
	switch s.kind {
	case "latest":
		return end
	case "offset":
		return min(max(s.offset, earliest), end)
	case "time":
		for o := earliest; o < end; o++ {
			if !m.bySeq[m.byPos[pubsub.Position{Partition: p, Offset: o}]].created.Before(s.at) {
				return o
			}
		}
		return end
	}
	return earliest
}

// Subscribe adds a handler consumer to a group.
func (m *machine) Subscribe(t *rapid.T) { m.join(t, false) }

// Stream adds a Stream consumer to a group.
func (m *machine) Stream(t *rapid.T) { m.join(t, true) }

// SubscribeBatch adds a batch consumer (see batchHandler) to a group, with
// a drawn batch size and wait.
func (m *machine) SubscribeBatch(t *rapid.T) {
	m.joinBatch = []pubsub.SubscribeOption{
		pubsub.WithBatchSize(rapid.SampledFrom([]int{1, 2, 3, 8}).Draw(t, "batchSize")),
		pubsub.WithBatchWait(time.Duration(rapid.SampledFrom([]int{0, 0, 3}).Draw(t, "batchWaitMs")) * time.Millisecond),
	}
	defer func() { m.joinBatch = nil }()
	m.join(t, false)
}

// join adds a consumer. A new group is created with a drawn Start and key
// concurrency, and its first epoch begins, in every partition, where that
// Start resolves against the retained range now: nothing runs between the
// model reading the range and Subscribe creating the group. Joining an
// existing group sometimes gives other options than it was created with:
// that, like a consumer already in the group, must fail with
// ErrSubscription and change nothing. A batch consumer with key
// concurrency must fail with ErrInvalid and change nothing.
func (m *machine) join(t *rapid.T, stream bool) {
	group := m.drawGroup(t)
	consumer := rapid.SampledFrom([]string{"c0", "c1", "c2", "c3"}).Draw(t, "consumer")
	prev, exists := m.groups[group]
	spec := m.starts[group]
	if !exists {
		spec = m.drawStart(t, "start", true)
		spec.keys = m.drawKeys(t, "keyConcurrency")
	} else if rapid.IntRange(0, 5).Draw(t, "otherOptions") == 0 {
		spec = m.drawStart(t, "otherStart", true)
		spec.keys = m.drawKeys(t, "otherKeyConcurrency")
	}
	invalid := m.joinBatch != nil && spec.concurrency() > 1
	refused := slices.Contains(m.members[group], consumer) || exists && !spec.same(m.starts[group])
	if !exists && len(m.groups) == 0 && !invalid {
		m.droppedGroupless = m.topic.Stats().Dropped
	}
	if !exists && !invalid {
		m.mu.Lock()
		for p := range m.partitions {
			start := m.resolve(spec, p)
			m.epochs[gp{group, p}] = []*epoch{newEpoch(start)}
			m.lastCommitted[gp{group, p}] = start
		}
		m.keyed[group] = spec.keys
		m.mu.Unlock()
	}
	var g *pubsub.Group[job]
	var s *pubsub.Stream[job]
	var err error
	if stream {
		if s, err = m.topic.Stream(group, consumer, spec.options()...); err == nil {
			g = s.Group()
		}
	} else if m.joinBatch != nil {
		g, err = m.topic.SubscribeBatch(group, consumer, m.batchHandler(group, consumer), append(spec.options(), m.joinBatch...)...)
	} else {
		g, err = m.topic.Subscribe(group, consumer, m.handler(group, consumer), spec.options()...)
	}
	if invalid {
		if !errors.Is(err, pubsub.ErrInvalid) {
			t.Fatalf("subscribing batch consumer %s to %s (%v): got %v, want ErrInvalid", consumer, group, spec, err)
		}
		m.checkAssignment(t, group)
		return
	}
	if refused {
		if !errors.Is(err, pubsub.ErrSubscription) {
			t.Fatalf("subscribing %s to %s (%v; members %v, created with %v): got %v, want ErrSubscription",
				consumer, group, spec, m.members[group], m.starts[group], err)
		}
		m.checkAssignment(t, group)
		return
	}
	if err != nil {
		t.Fatalf("join %s to %s (%v): %v", consumer, group, spec, err)
	}
	if exists && prev != g {
		t.Fatalf("Subscribe returned a second *Group for %s", group)
	}
	if !exists {
		m.starts[group] = spec
	}
	m.groups[group] = g
	m.members[group] = append(m.members[group], consumer)
	if stream {
		m.streams = append(m.streams, &streamModel{group: group, consumer: consumer, s: s, g: g})
	}
	m.checkAssignment(t, group)
}

// memberStream returns the stream that is consumer of group now, or nil.
func (m *machine) memberStream(group, consumer string) *streamModel {
	for _, st := range m.streams {
		if !st.left && st.group == group && st.consumer == consumer {
			return st
		}
	}
	return nil
}

// Leave removes a member. A stream that holds deliveries makes Leave wait
// until its context ends: it gets a short one, and must report the
// deadline and have left all the same; its held deliveries stay valid.
func (m *machine) Leave(t *rapid.T) {
	group, g := m.existingGroup(t)
	if len(m.members[group]) == 0 {
		t.Skip("no members")
	}
	consumer := rapid.SampledFrom(m.members[group]).Draw(t, "consumer")
	st := m.memberStream(group, consumer)
	holding := st != nil && len(m.heldBy(st)) > 0
	ctx, cancel := m.controlCtx(t, holding)
	defer cancel()
	err := g.Leave(ctx, consumer)
	switch {
	case holding && !errors.Is(err, context.DeadlineExceeded):
		t.Fatalf("Leave(%s, %s) holding deliveries: got %v, want DeadlineExceeded", group, consumer, err)
	case !holding && err != nil:
		t.Fatalf("Leave(%s, %s): %v", group, consumer, err)
	}
	m.members[group] = slices.DeleteFunc(m.members[group], func(c string) bool { return c == consumer })
	if st != nil {
		st.left = true
	}
	m.checkAssignment(t, group)
}

// checkAssignment: every partition has exactly one owner among the members
// (invariant 4's static half), and shares differ by at most one.
func (m *machine) checkAssignment(t *rapid.T, group string) {
	g, ok := m.groups[group]
	if !ok {
		return
	}
	a := g.Assignment()
	if !slices.Equal(slices.Sorted(maps.Keys(a)), slices.Sorted(slices.Values(m.members[group]))) {
		t.Fatalf("ownership: assignment %v of %s does not list exactly the members %v", a, group, m.members[group])
	}
	owners := map[int]string{}
	lo, hi := m.partitions, 0
	for c, ps := range a {
		lo, hi = min(lo, len(ps)), max(hi, len(ps))
		for _, p := range ps {
			if prev, ok := owners[p]; ok {
				t.Fatalf("ownership: partition %d of %s owned by %s and %s", p, group, prev, c)
			}
			owners[p] = c
		}
	}
	if len(a) > 0 && (len(owners) != m.partitions || hi-lo > 1) {
		t.Fatalf("ownership: assignment %v of %s is incomplete or unbalanced", a, group)
	}
}

// controlCtx is the context of a control call: none that ends, unless the
// call must wait for a Stream delivery the test holds, which only ends
// with the context; then a short deadline (virtual), 0 being one passed
// already.
func (m *machine) controlCtx(t *rapid.T, short bool) (context.Context, context.CancelFunc) {
	if !short {
		return context.WithCancel(context.Background())
	}
	d := rapid.SampledFrom([]time.Duration{0, time.Millisecond, settleTime}).Draw(t, "deadline")
	return context.WithTimeout(context.Background(), d)
}

func (m *machine) setPaused(group string, paused bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.paused[group] = paused
}

// Pause pauses a group. While a delivery of it is held, Pause waits for it
// until its context ends, and then must say so and have paused anyway: no
// delivery begins from then on (see beginLocked).
func (m *machine) Pause(t *rapid.T) {
	group, g := m.existingGroup(t)
	holding := len(m.held(group)) > 0
	ctx, cancel := m.controlCtx(t, holding)
	defer cancel()
	m.pause(ctx, t, group, g, holding)
}

// pause pauses group, g, within ctx: while the test holds a delivery of
// it (holding), Pause must wait for it until ctx ends and say so, and have
// paused anyway; otherwise it must succeed.
func (m *machine) pause(ctx context.Context, t *rapid.T, group string, g *pubsub.Group[job], holding bool) {
	err := g.Pause(ctx)
	switch {
	case holding && !errors.Is(err, context.DeadlineExceeded):
		t.Fatalf("Pause(%s) with a held delivery: got %v, want DeadlineExceeded", group, err)
	case !holding && err != nil:
		t.Fatalf("Pause(%s): %v", group, err)
	}
	m.setPaused(group, true)
}

func (m *machine) Resume(t *rapid.T) {
	group, g := m.existingGroup(t)
	m.setPaused(group, false)
	if err := g.Resume(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// Seek repositions one partition. While a delivery of that partition is
// held, Seek waits for it until its context ends, and then must say so
// and have moved nothing.
func (m *machine) Seek(t *rapid.T) {
	group, g := m.existingGroup(t)
	p := rapid.IntRange(0, m.partitions-1).Draw(t, "partition")
	if held := m.held(group); len(held) > 0 && rapid.Bool().Draw(t, "seekHeld") {
		p = held[rapid.IntRange(0, len(held)-1).Draw(t, "heldPartition")].d.Partition
	}
	defer m.quiesce(t, group, g)()
	earliest, end, _ := m.topic.Offsets(p)
	offset := rapid.Int64Range(max(0, earliest-1), end+1).Draw(t, "offset")
	valid := offset >= earliest && offset <= end
	if valid && m.heldOn(group, p) {
		before := g.Committed(p)
		ctx, cancel := m.controlCtx(t, true)
		defer cancel()
		err := g.Seek(ctx, p, offset)
		if !errors.Is(err, context.DeadlineExceeded) || g.Committed(p) != before {
			t.Fatalf("Seek(%s, %d, %d) with a held delivery: got %v and committed %d (was %d); want DeadlineExceeded and nothing moved",
				group, p, offset, err, g.Committed(p), before)
		}
		return
	}
	if valid {
		m.newEpoch(group, p, g.Committed(p), offset) // paused: the cursor stays put until the seek
	}
	err := g.Seek(context.Background(), p, offset)
	switch {
	case valid && err != nil:
		t.Fatalf("Seek(%s, %d, %d) in [%d, %d]: %v", group, p, offset, earliest, end, err)
	case !valid && !errors.Is(err, pubsub.ErrOffsetOutOfRange):
		t.Fatalf("Seek(%s, %d, %d) outside [%d, %d]: got %v, want ErrOffsetOutOfRange", group, p, offset, earliest, end, err)
	}
}

// Replay repositions every partition of a group to a drawn Start, through
// the Group or the Broker. While a delivery of the group is held, Replay
// waits for it until its context ends, and then must say so and have
// moved nothing; a negative offset is ErrInvalid and moves nothing either.
func (m *machine) Replay(t *rapid.T) {
	group, g := m.existingGroup(t)
	defer m.quiesce(t, group, g)()
	from := m.drawStart(t, "from", false)
	negative := rapid.IntRange(0, 15).Draw(t, "negative") == 0
	viaBroker := rapid.Bool().Draw(t, "viaBroker")
	replay := func(ctx context.Context, s pubsub.Start) error {
		if viaBroker {
			return m.b.Replay(ctx, group, "jobs", s)
		}
		return g.Replay(ctx, s)
	}
	stops := make([]int64, m.partitions) // where the old epochs end: the group is paused, so nothing commits
	for p := range m.partitions {
		stops[p] = g.Committed(p)
	}
	movedNothing := func(what string, err error) {
		for p := range m.partitions {
			if c := g.Committed(p); c != stops[p] {
				t.Fatalf("Replay(%s) %s: got %v, and partition %d moved from %d to %d", group, what, err, p, stops[p], c)
			}
		}
	}
	switch {
	case negative:
		err := replay(context.Background(), pubsub.AtOffset(-1))
		if !errors.Is(err, pubsub.ErrInvalid) {
			t.Fatalf("Replay(%s, AtOffset(-1)): got %v, want ErrInvalid", group, err)
		}
		movedNothing("from a negative offset", err)
		return
	case len(m.held(group)) > 0:
		ctx, cancel := m.controlCtx(t, true)
		defer cancel()
		err := replay(ctx, from.start())
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Replay(%s, %v) with a held delivery: got %v, want DeadlineExceeded", group, from, err)
		}
		movedNothing("with a held delivery", err)
		return
	}
	asked := make([]int64, m.partitions) // where each partition should go, as the model sees it now
	for p := range m.partitions {
		asked[p] = m.resolve(from, p)
	}
	if err := replay(context.Background(), from.start()); err != nil {
		t.Fatalf("Replay(%s, %v): %v", group, from, err)
	}
	// The group is paused, so its cursors are where the replay put them.
	// That can be past what the model asked for: seeking one partition
	// wakes the producers blocked on it, and their next appends, to
	// partitions not sought yet, can trim records that aged out.
	for p := range m.partitions {
		start := g.Committed(p)
		if earliest, _, _ := m.topic.Offsets(p); start < asked[p] || start > max(asked[p], earliest) {
			t.Fatalf("Replay(%s, %v): partition %d at %d, want %d or, if retention trimmed meanwhile, up to %d",
				group, from, p, start, asked[p], earliest)
		}
		m.newEpoch(group, p, stops[p], start)
	}
}

// quiesce pauses group and waits until every goroutine of the bubble is
// blocked; the function it returns resumes the group, unless it was
// paused before. The model of a seek reads the retained range and the
// committed offset before the call: that is exact only if nothing moves
// them during the call. A running group's seek waits for its deliveries in
// flight, and while it waits virtual time can pass, age retention can
// trim, and the seek then clamps to an earliest offset the model never
// saw (found by this suite: a replay that started past records nobody
// counted as skipped). Paused and quiet, the group's seek waits for
// nothing, so no time passes and nothing else runs until it is done.
//
// A paused group may still have deliveries in flight (a Pause whose
// context ended), so quiesce pauses it again all the same. While the test
// holds a delivery of the group, Pause waits for it until its context
// ends: it gets settleTime, by when every other delivery ended.
func (m *machine) quiesce(t *rapid.T, group string, g *pubsub.Group[job]) (resume func()) {
	wasPaused := m.paused[group]
	holding := len(m.held(group)) > 0
	ctx, cancel := context.WithCancel(context.Background())
	if holding {
		ctx, cancel = context.WithTimeout(context.Background(), settleTime)
	}
	defer cancel()
	m.pause(ctx, t, group, g, holding)
	synctest.Wait()
	if wasPaused {
		return func() {}
	}
	return func() {
		m.setPaused(group, false)
		_ = g.Resume(context.Background())
	}
}

// newEpoch closes the current epoch of (group, p) at stop, where the
// group's cursor was before the seek, and opens one at start.
func (m *machine) newEpoch(group string, p int, stop, start int64) {
	m.foldHistory() // attribute what happened so far to the old epoch
	k := gp{group, p}
	m.mu.Lock()
	defer m.mu.Unlock()
	eps := m.epochs[k]
	cur := eps[len(eps)-1]
	cur.stop, cur.closed = stop, true
	m.epochs[k] = append(eps, newEpoch(start))
	m.epochIdx[k]++
	m.lastCommitted[k] = start
}

// Advance moves virtual time: backoffs end, age retention trims.
func (m *machine) Advance(t *rapid.T) {
	time.Sleep(rapid.SampledFrom( // virtual time: the suite runs in a synctest bubble
		[]time.Duration{time.Millisecond, 100 * time.Millisecond, time.Second, 10 * time.Second}).Draw(t, "sleep"))
}

// Drain waits for every group to catch up, the member streams consuming as
// handlers would (see pump), then checks that it did (invariant 5); or,
// when a group with lag cannot move (paused, or without members), checks
// that Drain said so at once, naming each such group. A delivery the test
// holds is lag Drain can only wait out: then it gets a short deadline and
// must say what was left.
func (m *machine) Drain(t *rapid.T) {
	holding := m.held("")
	timeout := time.Hour
	if len(holding) > 0 {
		timeout = time.Millisecond
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	stopPumps := m.pump()
	defer stopPumps()
	start := time.Now()
	err := m.b.Drain(ctx)
	took := time.Since(start)
	stopPumps()
	var stalled []string
	for group, g := range m.groups {
		if (len(m.members[group]) == 0 || m.paused[group]) && g.Lag() > 0 {
			stalled = append(stalled, group)
		}
	}
	if len(stalled) > 0 {
		if !errors.Is(err, pubsub.ErrStalled) || took != 0 {
			t.Fatalf("Drain with stalled groups %v: got %v after %v, want ErrStalled at once", stalled, err, took)
		}
		for _, group := range stalled {
			if !strings.Contains(err.Error(), fmt.Sprintf("group %q", group)) {
				t.Fatalf("Drain: %v does not name the stalled group %s", err, group)
			}
		}
		return
	}
	if len(holding) > 0 {
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Drain with held deliveries: got %v, want DeadlineExceeded", err)
		}
		for _, d := range holding {
			if !strings.Contains(err.Error(), fmt.Sprintf("group %q", d.st.group)) {
				t.Fatalf("Drain: %v does not name %s, whose delivery is held", err, d.st.group)
			}
		}
		return
	}
	if err != nil {
		t.Fatalf("Drain: %v", err)
	}
	for group, g := range m.groups {
		if len(m.members[group]) == 0 || m.paused[group] {
			continue
		}
		for p := range m.partitions {
			if _, end, _ := m.topic.Offsets(p); g.Committed(p) != end {
				t.Fatalf("at-least-once: after Drain, %s committed %d of partition %d, end %d", group, g.Committed(p), p, end)
			}
		}
	}
}
