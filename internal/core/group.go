package core

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/logbus/logbus/engine"
	"github.com/logbus/logbus/internal/enum"
)

// DeliveryState is where the current record of one (group, partition) is in
// its delivery: the state diagram of the design, visible for tests. A worker
// that goes straight on to the next record it read shows that record's
// InFlight without an Acked in between.
type DeliveryState int32

const (
	Pending        DeliveryState = iota // nothing delivered yet
	InFlight                            // the handler is running
	Acked                               // the handler returned nil; the offset moved past it
	RetryScheduled                      // it failed and the worker waits out the backoff
	DeadLettered                        // it failed for good; parked, and the offset moved past it
)

var deliveryStateNames = []string{Pending: "pending", InFlight: "in-flight", Acked: "acked",
	RetryScheduled: "retry-scheduled", DeadLettered: "dead-lettered"}

func (s DeliveryState) String() string { return enum.Name(deliveryStateNames, "DeliveryState", s) }

// Group is a consumer group on one topic: members sharing one cursor per
// partition, each partition owned by one member and served by at most one
// worker goroutine at a time.
//
// Control calls (join, Leave, Pause, Resume, Seek, Replay, shutdown) change
// what the group wants under mu and tell the workers concerned to stop
// after their current delivery; none of them holds a lock while it waits.
// A worker that stops starts its successor itself when the group wants one
// (a new owner, a resume) and no seek holds the partition, so a control
// call that stops waiting when its context ends leaves nothing undone: the
// change completes when the delivery in flight does. Only a seek, which
// must move a cursor nobody reads, waits for the partition to be idle
// before it acts, and is not applied if its context ends first.
type Group struct {
	name   string
	topic  *Topic
	broker *Broker
	spec   GroupSpec // resolved (GroupSpec.Resolve), as later joins must resolve

	mu      sync.Mutex // guards the fields below
	members []*member  // in join order
	paused  bool
	stopped bool          // Close began: no worker starts again
	idle    chan struct{} // closed and replaced when a worker exits
	// detached: the group was deleted and its cursors left their
	// partitions (see settleLocked).
	detached bool

	parts []*groupPartition // fixed; each guarded by mu as its doc says

	retried, deadLettered, skipped, redriven atomic.Int64 // Delivered is counted per partition
	dlq                                      deadLetters

	// deleted is set once, by DeleteGroup or DeleteTopic (see remove), to
	// the error every call on the group returns from then on. The reads
	// (Lag, Committed, Assignment, DeadLetters) load it without mu and then
	// show an empty group.
	deleted atomic.Pointer[deletion]
}

// deletion is why a group takes no more calls: it, or its topic, was
// deleted.
type deletion struct{ err error }

type member struct {
	name    string
	handler Handler      // the per-record handler, or nil for a batch consumer
	batch   BatchHandler // the batch handler, or nil for a per-record consumer
	spec    BatchSpec    // resolved; for a batch consumer only
	onLeave func()       // called once, after the member left and its last worker exited; may be nil

	// Guarded by Group.mu.
	left      bool // removed from the group, by Leave or shutdown
	running   int  // workers serving it
	finishing bool // someone took the job of calling onLeave
	gone      bool // onLeave returned: the member is entirely out
}

// groupPartition is the group's state for one partition. It outlives the
// workers that serve it.
type groupPartition struct {
	index  int
	part   *Partition
	cursor *Cursor
	owner  *member // guarded by Group.mu: who should serve it; nil when the group has no members
	w      *worker // guarded by Group.mu: the worker serving it, stopping or not; nil when none runs
	holds  int     // guarded by Group.mu: seeks waiting for the partition to be idle; no worker starts meanwhile

	// progress is the partition's DeliveryState (the low 8 bits), the
	// attempt on the current record (the next 8, saturating at 255) and
	// the count of its acks (the rest), in one word so that a state, its
	// attempt and the count are one atomic store: a snapshot or the stuck
	// watchdog reads them without a lock, and a retry of the same record
	// shows a word of its own. Only the running worker writes it (see
	// retryOffset), from acks, its own count.
	progress atomic.Uint64
	acks     uint64 // the acks so far; see ack for when progress shows them

	// The attempts made on the record at retryOffset, kept across workers so
	// that a redelivery after a rebalance continues the count. Only the
	// running worker touches them, or a seek while none runs; Group.mu,
	// which a worker takes to exit and a seek holds, orders the accesses.
	retryOffset int64
	attempts    int

	redrive redriveQueue // dead letters sent back by Redrive

	// keys is the state of key concurrency (see keys.go), kept across
	// workers as retryOffset is; nil when the group has none (n = 1).
	keys *keyed

	_ cacheLinePad // progress is written per delivery: keep other partitions' off its line
}

// setState records where the current delivery stands, and the acks so far.
func (gp *groupPartition) setState(s DeliveryState) {
	gp.progress.Store(gp.acks<<progressAcks | uint64(min(gp.attempts, 0xff))<<8 | uint64(s))
}

// progressAcks is where the count of acks starts in progress.
const progressAcks = 16

// unpackProgress splits a progress word.
func unpackProgress(w uint64) (s DeliveryState, attempt int, acks uint64) {
	return DeliveryState(w & 0xff), int(w >> 8 & 0xff), w >> progressAcks
}

// ack counts an ack. When the worker goes straight on to its next record
// (more is true), the count is shown with that record's InFlight rather
// than by an Acked of its own: one atomic store per delivery rather than
// two, and the count is exact whenever a handler runs. showAck shows it if
// the worker stops before then.
func (gp *groupPartition) ack(more bool) {
	gp.acks++
	if !more {
		gp.setState(Acked)
	}
}

// unack takes back the last ack: its commit failed, so the record counts
// as not delivered (see deliverBatch).
func (gp *groupPartition) unack() {
	gp.acks--
	gp.setState(Pending)
}

// showAck stores the state Acked if progress does not show every ack yet.
func (gp *groupPartition) showAck() {
	if gp.progress.Load()>>progressAcks != gp.acks {
		gp.setState(Acked)
	}
}

// newGroup makes the group with spec, resolved.
func newGroup(b *Broker, t *Topic, name string, spec GroupSpec) *Group {
	limit := spec.DeadLetterLimit
	if limit == engine.NoDeadLetters {
		limit = 0 // every letter is evicted as it comes
	}
	g := &Group{
		name:   name,
		topic:  t,
		broker: b,
		spec:   spec,
		idle:   make(chan struct{}),
		dlq:    deadLetters{limit: limit},
	}
	for _, p := range t.parts {
		c := b.offsets.Cursor(OffsetKey{Group: name, Topic: t.name, Partition: p.index})
		p.subscribe(c, name, spec.Start)
		gp := &groupPartition{index: p.index, part: p, cursor: c, retryOffset: -1}
		if spec.KeyConcurrency > 1 {
			gp.keys = newKeyed()
		}
		g.parts = append(g.parts, gp)
	}
	return g
}

// Name returns the group's name.
func (g *Group) Name() string { return g.name }

// handlers is what a member does with its records: one of one and batch
// is set; spec, resolved, goes with batch.
type handlers struct {
	one   Handler
	batch BatchHandler
	spec  BatchSpec
}

// join adds a member and rebalances. It does not wait: a partition that
// moves to the new member finishes its current delivery first. spec,
// resolved, must equal the group's own (ErrSubscription otherwise); after
// the broker began closing it fails with ErrClosed. It returns the
// rebalance event (nil when there is none) rather than raising it, for a
// caller that holds a lock to raise it after releasing it
// (Broker.Subscribe holds the broker's).
func (g *Group) join(name string, h handlers, onLeave func(), spec GroupSpec) (*Event, error) {
	switch {
	case name == "":
		return nil, fmt.Errorf("%w: empty consumer name", ErrSubscription)
	case h.one == nil && h.batch == nil:
		return nil, fmt.Errorf("%w: nil handler", ErrSubscription)
	case !spec.Equal(g.spec):
		return nil, fmt.Errorf("%w: the group exists with other options than these", ErrSubscription)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stopped || g.broker.State() != Running {
		return nil, ErrClosed
	}
	if g.memberLocked(name) != nil {
		return nil, fmt.Errorf("%w: the group already has this consumer", ErrSubscription)
	}
	before := g.observedAssignmentLocked()
	g.members = append(g.members, &member{name: name, handler: h.one, batch: h.batch, spec: h.spec, onLeave: onLeave})
	g.rebalanceLocked()
	return g.rebalanceEventLocked(before), nil
}

// Leave removes a member and rebalances: its partitions finish their
// current delivery, then move to the remaining members, which start at the
// committed offsets. Leave waits for those deliveries until ctx ends; when
// it ends first, Leave returns an error wrapping ctx's, and the partitions
// move as soon as their deliveries end.
func (g *Group) Leave(ctx context.Context, name string) error {
	g.mu.Lock()
	if g.stopped {
		g.mu.Unlock()
		return ErrClosed
	}
	if err := g.deletedErr(); err != nil {
		g.mu.Unlock()
		return err
	}
	m := g.memberLocked(name)
	if m == nil {
		g.mu.Unlock()
		return fmt.Errorf("%w: no such consumer in the group", ErrSubscription)
	}
	before := g.observedAssignmentLocked()
	g.members = slices.DeleteFunc(g.members, func(x *member) bool { return x == m })
	m.left = true
	g.rebalanceLocked()
	if e := g.rebalanceEventLocked(before); e != nil {
		g.mu.Unlock()
		g.observe(e)
		g.mu.Lock()
	}
	if m.finishLocked() {
		g.mu.Unlock()
		g.finishLeave(m)
		g.mu.Lock()
	}
	err := g.waitLocked(ctx, func() bool { return m.gone })
	if err != nil {
		err = fmt.Errorf("deliveries still in flight on %s: %w",
			g.partitionsLocked(func(gp *groupPartition) bool { return gp.w != nil && gp.w.m == m }), err)
	}
	g.mu.Unlock()
	g.broker.notifyProgress() // a group without members no longer holds Drain up
	return err
}

// finishLocked reports whether the caller is the one to finish the
// member's leaving (see finishLeave): it left and no worker serves it any
// more, and nobody took the job yet.
func (m *member) finishLocked() bool {
	if !m.left || m.running > 0 || m.finishing {
		return false
	}
	m.finishing = true
	return true
}

// finishLeave calls the member's onLeave, outside mu, then marks it gone
// and wakes whoever waits for that (Leave).
func (g *Group) finishLeave(m *member) {
	if m.onLeave != nil {
		m.onLeave()
	}
	g.mu.Lock()
	m.gone = true
	g.broadcastLocked()
	done := g.settleLocked()
	g.mu.Unlock()
	if done {
		g.broker.forgetRetired(g)
	}
}

// broadcastLocked wakes every waitLocked.
func (g *Group) broadcastLocked() {
	close(g.idle)
	g.idle = make(chan struct{})
}

func (g *Group) memberLocked(name string) *member {
	for _, m := range g.members {
		if m.name == name {
			return m
		}
	}
	return nil
}

// rebalanceLocked deals the partitions out again. The workers of the
// partitions that change hands are told to stop; each starts its
// successor, for the new owner, when it exits.
func (g *Group) rebalanceLocked() {
	names := make([]string, len(g.members))
	for i, m := range g.members {
		names[i] = m.name
	}
	prev := make([]string, len(g.parts))
	for i, gp := range g.parts {
		if gp.owner != nil {
			prev[i] = gp.owner.name
		}
	}
	for i, owner := range engine.Assign(names, len(g.parts), prev) {
		gp := g.parts[i]
		if owner == prev[i] {
			continue
		}
		gp.owner = g.memberLocked(owner)
		if gp.w != nil {
			gp.w.signal()
		}
	}
	g.startLocked()
}

// startLocked starts a worker on every partition that should have one and
// has none.
func (g *Group) startLocked() {
	for _, gp := range g.parts {
		g.startOneLocked(gp)
	}
}

// startOneLocked starts a worker on gp if the group wants one there: it
// has an owner, the group is neither paused, stopped nor deleted, no seek
// holds it,
// and no worker, stopping or not, serves it (which is what keeps each
// partition to one worker at a time).
func (g *Group) startOneLocked(gp *groupPartition) {
	if gp.w != nil || gp.owner == nil || gp.holds > 0 || g.paused || g.stopped || g.deleted.Load() != nil {
		return
	}
	gp.owner.running++
	gp.w = startWorker(g, gp, gp.owner)
}

// exited is the last thing a worker does. It hands the partition on: to a
// successor, if the group wants one, and to whoever waits for it to be idle.
func (g *Group) exited(w *worker) {
	g.mu.Lock()
	gp, m := w.gp, w.m
	gp.w = nil
	m.running--
	finish := m.finishLocked()
	g.startOneLocked(gp)
	g.broadcastLocked()
	done := g.settleLocked()
	g.mu.Unlock()
	if finish {
		g.finishLeave(m)
	}
	if done {
		g.broker.forgetRetired(g)
	}
}

// waitLocked waits until done, which is read under mu, holds, or ctx ends.
// mu is held on entry and on return, and released while waiting.
func (g *Group) waitLocked(ctx context.Context, done func() bool) error {
	for !done() {
		idle := g.idle
		g.mu.Unlock()
		select {
		case <-idle:
		case <-ctx.Done():
		}
		g.mu.Lock()
		if err := ctx.Err(); err != nil && !done() {
			return err
		}
	}
	return nil
}

// partitionsLocked names the partitions that match, for error messages.
func (g *Group) partitionsLocked(match func(*groupPartition) bool) string {
	var b strings.Builder
	b.WriteString("partitions")
	sep := " "
	for _, gp := range g.parts {
		if match(gp) {
			fmt.Fprintf(&b, "%s%d (offset %d)", sep, gp.index, gp.cursor.Committed())
			sep = ", "
		}
	}
	return b.String()
}

// Assignment returns each member's partitions. Members that own none are
// present with an empty list; a deleted group has none.
func (g *Group) Assignment() map[string][]int {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.deleted.Load() != nil {
		return map[string][]int{}
	}
	return g.assignmentLocked()
}

// Pause stops the group's deliveries after the ones in flight; the records
// stay in the log and the offsets where they are. The group is paused at
// once; Pause waits for the deliveries in flight until ctx ends, and then
// returns an error wrapping ctx's that names them. A no-op after the
// broker stopped; the deletion's error once the group was deleted.
func (g *Group) Pause(ctx context.Context) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stopped {
		return nil
	}
	if err := g.deletedErr(); err != nil {
		return err
	}
	g.paused = true
	g.signalLocked(func(*groupPartition) bool { return true })
	g.broker.notifyProgress() // a paused group no longer holds Drain up
	if err := g.waitLocked(ctx, g.noWorkerLocked(func(*groupPartition) bool { return true })); err != nil {
		return fmt.Errorf("deliveries still in flight on %s: %w",
			g.partitionsLocked(func(gp *groupPartition) bool { return gp.w != nil }), err)
	}
	return nil
}

// Resume restarts deliveries from the committed offsets. It does not wait
// (its context is for engines that do): a partition whose delivery from
// before the pause is still in flight restarts when that delivery ends. A
// no-op after the broker stopped; the deletion's error once the group was
// deleted.
func (g *Group) Resume(context.Context) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := g.deletedErr(); err != nil && !g.stopped {
		return err
	}
	g.paused = false
	g.startLocked()
	g.broker.notifyProgress() // Drain may have been told the group stalled
	return nil
}

func (g *Group) signalLocked(match func(*groupPartition) bool) {
	for _, gp := range g.parts {
		if gp.w != nil && match(gp) {
			gp.w.signal()
		}
	}
}

func (g *Group) noWorkerLocked(match func(*groupPartition) bool) func() bool {
	return func() bool {
		for _, gp := range g.parts {
			if gp.w != nil && match(gp) {
				return false
			}
		}
		return true
	}
}

// Seek moves the group's cursor on one partition to offset, which must lie
// within [earliest retained, end]; anything else is ErrOffsetOutOfRange. The
// partition's worker finishes its current delivery first and restarts at
// offset; Seek waits for it until ctx ends, and when ctx ends first it
// moves nothing and returns an error wrapping ctx's. A seek starts a new
// epoch: attempt counts start again. Once Close began it moves nothing and
// fails with ErrClosed, whatever its arguments: a drain must not see a
// cursor it found caught up move back.
func (g *Group) Seek(ctx context.Context, partition int, offset int64) error {
	if g.closing() {
		return ErrClosed
	}
	if err := g.deletedErr(); err != nil {
		return err
	}
	if partition < 0 || partition >= len(g.parts) {
		return fmt.Errorf("%w: no such partition (the topic has %d)", ErrInvalid, len(g.parts))
	}
	if earliest, end := g.parts[partition].part.Bounds(); offset < earliest || offset > end {
		return outOfRange(earliest, end)
	}
	return g.reposition(ctx, func(gp *groupPartition) bool { return gp.index == partition },
		func(gp *groupPartition) error { return gp.part.seek(gp.cursor, offset) })
}

// Replay moves every partition's cursor to from (see Start), at once: the
// workers finish their current deliveries, and no partition restarts
// before every cursor moved. Like Seek, it waits until ctx ends, and then
// moves nothing, and fails with ErrClosed once Close began.
func (g *Group) Replay(ctx context.Context, from Start) error {
	if g.closing() {
		return ErrClosed
	}
	if err := from.Validate(); err != nil {
		return err
	}
	return g.reposition(ctx, func(*groupPartition) bool { return true },
		func(gp *groupPartition) error { gp.part.seekStart(gp.cursor, from); return nil })
}

// reposition holds the partitions that match, waits for their workers to
// exit, then moves each cursor with move and starts the workers again.
func (g *Group) reposition(ctx context.Context, match func(*groupPartition) bool, move func(*groupPartition) error) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stopped || g.closing() {
		return ErrClosed
	}
	if err := g.deletedErr(); err != nil {
		return err
	}
	for _, gp := range g.parts {
		if match(gp) {
			gp.holds++
		}
	}
	g.signalLocked(match)
	err := g.waitLocked(ctx, g.noWorkerLocked(match))
	switch {
	case err != nil:
		err = fmt.Errorf("moved nothing: deliveries still in flight on %s: %w",
			g.partitionsLocked(func(gp *groupPartition) bool { return match(gp) && gp.w != nil }), err)
	case g.stopped || g.closing(): // Close began while it waited
		err = fmt.Errorf("%w: moved nothing", ErrClosed)
	default:
		// Deleted while it waited: its cursors are sealed, and moving one
		// would unseal it.
		err = g.deletedErr()
	}
	for _, gp := range g.parts {
		if !match(gp) {
			continue
		}
		if err == nil {
			err = move(gp)
			gp.retryOffset, gp.attempts = -1, 0
			gp.keys.discard() // a seek starts a new epoch: what the window held is read again
		}
		gp.holds--
	}
	g.startLocked()
	g.broker.notifyProgress()
	return err
}

// closing reports whether the broker's Close began.
func (g *Group) closing() bool { return g.broker.State() != Running }

// Committed returns the next offset the group will read from partition, or
// -1 when the topic has no such partition or the group was deleted.
func (g *Group) Committed(partition int) int64 {
	if partition < 0 || partition >= len(g.parts) || g.deleted.Load() != nil {
		return -1
	}
	return g.parts[partition].cursor.Committed()
}

// Lag returns how many records, over all partitions, the group has yet to
// commit: 0 once the group was deleted.
func (g *Group) Lag() int64 {
	if g.deleted.Load() != nil {
		return 0
	}
	var lag int64
	for _, gp := range g.parts {
		lag += max(0, gp.part.End()-gp.cursor.Committed())
	}
	return lag
}

// DeliveryState returns where the current delivery of a partition stands.
func (g *Group) DeliveryState(partition int) DeliveryState {
	if partition < 0 || partition >= len(g.parts) {
		return Pending
	}
	return DeliveryState(g.parts[partition].progress.Load() & 0xff)
}

// Stats returns the group's counters.
func (g *Group) Stats() GroupStats {
	_, evicted := g.dlq.counts()
	var delivered int64
	for _, gp := range g.parts {
		delivered += int64(gp.progress.Load() >> progressAcks)
	}
	return GroupStats{
		Delivered:          delivered,
		Retried:            g.retried.Load(),
		DeadLettered:       g.deadLettered.Load(),
		Skipped:            g.skipped.Load(),
		DeadLettersEvicted: evicted,
		Redriven:           g.redriven.Load(),
	}
}

// DeadLetters returns the group's dead letters, oldest first: none once
// the group was deleted.
func (g *Group) DeadLetters() []DeadLetter {
	if g.deleted.Load() != nil {
		return nil
	}
	letters, _ := g.dlq.snapshot()
	return letters
}

// isStopped is what stalled says of a group Close stopped.
const isStopped = "is stopped"

// stalled reports why the group cannot make progress ("is paused", "has
// no consumers"), or "" when it can. Drain waits only for groups that can.
func (g *Group) stalled() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case g.stopped:
		return isStopped
	case g.paused:
		return "is paused"
	case len(g.members) == 0:
		return "has no consumers"
	}
	return ""
}

// shutdown stops the group for good: no worker starts again, the running
// ones are told to stop, and every member counts as left (its onLeave runs
// once its workers exited). Used by Broker.Close.
func (g *Group) shutdown() {
	g.mu.Lock()
	g.stopped = true
	g.signalLocked(func(*groupPartition) bool { return true })
	var finish []*member
	for _, m := range g.members {
		m.left = true
		if m.finishLocked() {
			finish = append(finish, m)
		}
	}
	g.mu.Unlock()
	for _, m := range finish {
		g.finishLeave(m)
	}
}

// waitStopped waits, until ctx ends, for the group's workers to exit and
// its members to be told they left.
func (g *Group) waitStopped(ctx context.Context) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	noWorker := g.noWorkerLocked(func(*groupPartition) bool { return true })
	return g.waitLocked(ctx, func() bool {
		return noWorker() && !slices.ContainsFunc(g.members, func(m *member) bool { return !m.gone })
	})
}

// unfinished lists the partitions the group has not committed to the end,
// and whether a worker still runs there. The cursors are sealed first, so
// nothing committed later changes what it reports.
func (g *Group) unfinished() []Unfinished {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []Unfinished
	for _, gp := range g.parts {
		c := gp.cursor.Seal()
		if end := gp.part.End(); c < end || gp.w != nil {
			out = append(out, Unfinished{Group: g.name, Topic: g.topic.name, Partition: gp.index,
				Committed: c, End: end, Running: gp.w != nil})
		}
	}
	return out
}
