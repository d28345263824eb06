package core

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
)

// Handler processes one record for one group. It runs on the worker goroutine
// of the record's partition, so calls for one partition never overlap. nil
// acks; an error (or a panic) is a failed attempt. attempt is 1 on the first
// delivery of the record in the group's current epoch (see Group.Seek) and
// counts up across retries and across redeliveries after a rebalance.
//
// rec is valid until the handler returns, not after: see Record.
//
// ctx ends only when the broker stops without finishing its drain: a handler
// must return soon after, and Close waits for it.
type Handler func(ctx context.Context, rec *Record, attempt int) error

// GroupConfig is what a group is created with. Zero fields mean the defaults.
type GroupConfig struct {
	Retry           RetryPolicy // zero: the broker's policy
	DeadLetterLimit int         // dead letters kept, oldest evicted first; default 1024
}

// GroupStats counts what a group's workers did. The counters belong to the
// group, not to a worker, so they survive rebalances.
type GroupStats struct {
	Delivered          int64 // records acked
	Retried            int64 // failed attempts that were retried
	DeadLettered       int64 // records given up on
	Skipped            int64 // records trimmed by retention before the group read them
	DeadLettersEvicted int64 // dead letters pushed out of the bounded queue
}

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

func (s DeliveryState) String() string {
	switch s {
	case Pending:
		return "pending"
	case InFlight:
		return "in-flight"
	case Acked:
		return "acked"
	case RetryScheduled:
		return "retry-scheduled"
	case DeadLettered:
		return "dead-lettered"
	}
	return fmt.Sprintf("DeliveryState(%d)", int32(s))
}

// Group is a consumer group on one topic: members sharing one cursor per
// partition, each partition owned by one member and served by one worker
// goroutine.
//
// Membership changes, pauses, seeks and stop are serialised by lock. They
// wait for the workers they stop; a worker stops only between deliveries, so
// none of them may be called from a handler of the same group.
type Group struct {
	name   string
	topic  *Topic
	broker *Broker
	retry  RetryPolicy

	// lock serialises the operations that start and stop workers. It is a
	// channel, not a mutex, so a goroutine waiting for it is durably blocked
	// under testing/synctest.
	lock chan struct{}

	// mu guards the fields below for readers; writers hold lock as well.
	mu      sync.Mutex
	members []*member // in join order
	paused  bool
	stopped bool
	parts   []*groupPartition

	retried, deadLettered, skipped atomic.Int64 // Delivered is counted per partition
	dlq                            deadLetters
}

type member struct {
	name    string
	handler Handler
	onLeave func() // called once, after the member's workers have stopped; may be nil
}

// groupPartition is the group's state for one partition. It outlives the
// workers that serve it.
type groupPartition struct {
	part   *Partition
	cursor *Cursor
	owner  *member // guarded by Group.mu; nil when the group has no members
	w      *worker // guarded by Group.lock; nil when no worker runs

	// progress is the partition's DeliveryState (the low 8 bits) and the
	// count of its acks (the rest), in one word so that a state and the
	// count are one atomic store. Only the running worker writes it (see
	// retryOffset), from acks, its own count.
	progress atomic.Uint64
	acks     uint64 // the acks so far; see ack for when progress shows them

	// The attempts made on the record at retryOffset, kept across workers so
	// that a redelivery after a rebalance continues the count. Only the
	// running worker touches them; the stop/start of workers orders the
	// accesses of successive workers.
	retryOffset int64
	attempts    int

	_ cacheLinePad // progress is written per delivery: keep other partitions' off its line
}

// setState records where the current delivery stands, and the acks so far.
func (gp *groupPartition) setState(s DeliveryState) {
	gp.progress.Store(gp.acks<<8 | uint64(s))
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

// showAck stores the state Acked if progress does not show every ack yet.
func (gp *groupPartition) showAck() {
	if gp.progress.Load()>>8 != gp.acks {
		gp.setState(Acked)
	}
}

func newGroup(b *Broker, t *Topic, name string, cfg GroupConfig) (*Group, error) {
	retry := b.retry
	if cfg.Retry != (RetryPolicy{}) {
		var err error
		if retry, err = cfg.Retry.Resolve(); err != nil {
			return nil, err
		}
	}
	limit := cfg.DeadLetterLimit
	switch {
	case limit < 0:
		return nil, fmt.Errorf("%w: dead-letter limit %d is negative", ErrInvalid, limit)
	case limit == 0:
		limit = DefaultDeadLetterLimit
	}
	g := &Group{
		name:   name,
		topic:  t,
		broker: b,
		retry:  retry,
		lock:   make(chan struct{}, 1),
		dlq:    deadLetters{limit: limit},
	}
	for _, p := range t.parts {
		c := b.offsets.Cursor(OffsetKey{Group: name, Topic: t.name, Partition: p.index})
		p.subscribe(name, c)
		g.parts = append(g.parts, &groupPartition{part: p, cursor: c, retryOffset: -1})
	}
	return g, nil
}

func (g *Group) acquire() { g.lock <- struct{}{} }
func (g *Group) release() { <-g.lock }

// Name returns the group's name.
func (g *Group) Name() string { return g.name }

// Topic returns the name of the group's topic.
func (g *Group) Topic() string { return g.topic.name }

// Join adds a member and rebalances. It waits for the partitions that move
// to finish their current delivery. After the broker began closing it fails
// with ErrClosed.
func (g *Group) Join(name string, h Handler, onLeave func()) error {
	switch {
	case name == "":
		return fmt.Errorf("%w: group %q: empty consumer name", ErrSubscription, g.name)
	case h == nil:
		return fmt.Errorf("%w: group %q consumer %q: nil handler", ErrSubscription, g.name, name)
	}
	g.acquire()
	defer g.release()
	if g.stopped || g.broker.State() != Running {
		return fmt.Errorf("%w: join group %q", ErrClosed, g.name)
	}
	if g.memberLocked(name) != nil {
		return fmt.Errorf("%w: group %q already has consumer %q", ErrSubscription, g.name, name)
	}
	g.mu.Lock()
	g.members = append(g.members, &member{name: name, handler: h, onLeave: onLeave})
	g.mu.Unlock()
	g.rebalanceLocked()
	return nil
}

// Leave removes a member and rebalances: its partitions finish their current
// delivery, then move to the remaining members, which start at the committed
// offsets. A delivery the member had not acked is delivered again.
func (g *Group) Leave(name string) error {
	g.acquire()
	if g.stopped {
		g.release()
		return fmt.Errorf("%w: leave group %q", ErrClosed, g.name)
	}
	m := g.memberLocked(name)
	if m == nil {
		g.release()
		return fmt.Errorf("%w: group %q has no consumer %q", ErrSubscription, g.name, name)
	}
	g.mu.Lock()
	g.members = slices.DeleteFunc(g.members, func(x *member) bool { return x == m })
	g.mu.Unlock()
	g.rebalanceLocked()
	g.release()
	g.broker.notifyProgress() // a group without members no longer holds Drain up
	if m.onLeave != nil {
		m.onLeave()
	}
	return nil
}

func (g *Group) memberLocked(name string) *member {
	for _, m := range g.members {
		if m.name == name {
			return m
		}
	}
	return nil
}

// rebalanceLocked deals the partitions out again and restarts only the
// workers of the partitions that changed hands.
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
	owners := assign(names, len(g.parts), prev)
	g.stopWorkersLocked(func(i int) bool { return owners[i] != prev[i] })
	g.mu.Lock()
	for i, gp := range g.parts {
		gp.owner = g.memberLocked(owners[i])
	}
	g.mu.Unlock()
	g.startWorkersLocked()
}

// stopWorkersLocked stops the workers of the partitions that match: all are
// told first, then each is waited for, so the slowest delivery bounds the
// wait, not their sum.
func (g *Group) stopWorkersLocked(match func(partition int) bool) {
	var stopping []*worker
	for i, gp := range g.parts {
		if gp.w != nil && match(i) {
			gp.w.signal()
			stopping = append(stopping, gp.w)
			gp.w = nil
		}
	}
	for _, w := range stopping {
		w.wait()
	}
}

func (g *Group) startWorkersLocked() {
	if g.paused || g.stopped {
		return
	}
	for _, gp := range g.parts {
		if gp.owner != nil && gp.w == nil {
			gp.w = startWorker(g, gp, gp.owner)
		}
	}
}

// Assignment returns each member's partitions. Members that own none are
// present with an empty list.
func (g *Group) Assignment() map[string][]int {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make(map[string][]int, len(g.members))
	for _, m := range g.members {
		out[m.name] = []int{}
	}
	for i, gp := range g.parts {
		if gp.owner != nil {
			out[gp.owner.name] = append(out[gp.owner.name], i)
		}
	}
	return out
}

// Members returns the members' names in join order.
func (g *Group) Members() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	names := make([]string, len(g.members))
	for i, m := range g.members {
		names[i] = m.name
	}
	return names
}

// Pause stops every worker of the group after its current delivery; the
// records stay in the log and the offsets where they are. A no-op after the
// broker stopped.
func (g *Group) Pause() {
	g.acquire()
	defer g.release()
	g.mu.Lock()
	g.paused = true
	g.mu.Unlock()
	g.stopWorkersLocked(func(int) bool { return true })
	g.broker.notifyProgress() // a paused group no longer holds Drain up
}

// Resume restarts the workers from the committed offsets.
func (g *Group) Resume() {
	g.acquire()
	defer g.release()
	g.mu.Lock()
	g.paused = false
	g.mu.Unlock()
	g.startWorkersLocked()
}

// Paused reports whether the group is paused.
func (g *Group) Paused() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.paused
}

// Seek moves the group's cursor on one partition to offset, which must lie
// within [earliest retained, end]; anything else is ErrOffsetOutOfRange. The
// partition's worker finishes its current delivery first and restarts at
// offset. A seek starts a new epoch: attempt counts start again.
func (g *Group) Seek(partition int, offset int64) error {
	if partition < 0 || partition >= len(g.parts) {
		return fmt.Errorf("%w: group %q: topic %q has no partition %d", ErrInvalid, g.name, g.topic.name, partition)
	}
	return g.reposition(func(i int) bool { return i == partition }, offset, false)
}

// Replay rewinds every partition to max(from, earliest retained), or to the
// end where from is past it. It is a seek on every partition at once.
func (g *Group) Replay(from int64) error {
	if from < 0 {
		return fmt.Errorf("%w: group %q: replay from negative offset %d", ErrInvalid, g.name, from)
	}
	return g.reposition(func(int) bool { return true }, from, true)
}

func (g *Group) reposition(match func(int) bool, offset int64, clamp bool) error {
	g.acquire()
	defer g.release()
	if g.stopped {
		return fmt.Errorf("%w: seek group %q", ErrClosed, g.name)
	}
	g.stopWorkersLocked(match)
	var err error
	for i, gp := range g.parts {
		if !match(i) {
			continue
		}
		if _, err = gp.part.seek(gp.cursor, offset, clamp); err != nil {
			err = fmt.Errorf("group %q: %w", g.name, err)
			break
		}
		gp.retryOffset, gp.attempts = -1, 0
	}
	g.startWorkersLocked()
	g.broker.notifyProgress()
	return err
}

// Committed returns the next offset the group will read from partition, or
// -1 when the topic has no such partition.
func (g *Group) Committed(partition int) int64 {
	if partition < 0 || partition >= len(g.parts) {
		return -1
	}
	return g.parts[partition].cursor.Committed()
}

// Lag returns how many records, over all partitions, the group has yet to
// commit.
func (g *Group) Lag() int64 {
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
	_, evicted := g.dlq.snapshot()
	var delivered int64
	for _, gp := range g.parts {
		delivered += int64(gp.progress.Load() >> 8)
	}
	return GroupStats{
		Delivered:          delivered,
		Retried:            g.retried.Load(),
		DeadLettered:       g.deadLettered.Load(),
		Skipped:            g.skipped.Load(),
		DeadLettersEvicted: evicted,
	}
}

// DeadLetters returns the group's dead letters, oldest first.
func (g *Group) DeadLetters() []DeadLetter {
	letters, _ := g.dlq.snapshot()
	return letters
}

// active reports whether the group can make progress: it has a member and
// is not paused. Drain waits only for active groups.
func (g *Group) active() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.members) > 0 && !g.paused && !g.stopped
}

// stop stops every worker for good and tells every member it left. Used by
// Broker.Close.
func (g *Group) stop() {
	g.acquire()
	g.mu.Lock()
	g.stopped = true
	members := slices.Clone(g.members)
	g.mu.Unlock()
	g.stopWorkersLocked(func(int) bool { return true })
	g.release()
	for _, m := range members {
		if m.onLeave != nil {
			m.onLeave()
		}
	}
}
