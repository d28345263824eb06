package core

import (
	"context"
	"fmt"
	"slices"

	"github.com/logbus/logbus/engine"
)

// This file is the lifecycle of groups and topics beyond Subscribe and
// Close: deleting them, and dropping or paging a group's dead letters
// (engine.Deleter, engine.DeadLetterDiscarder, engine.DeadLetterReader).
//
// A deletion happens at once, under the broker's lock: the name leaves the
// registry (a new group or topic may take it at once, and starts fresh),
// the offsets are forgotten, and the group is marked deleted, so every
// later call on it fails. Only then does the deleter wait, bounded by its
// ctx, for the deliveries in flight: a deleted group whose workers still
// run is "retired", and Close waits for it as for any other group. Its
// cursors leave their partitions only once no worker runs (see
// settleLocked), since a worker may hold records its cursor does not
// protect any more.

var (
	_ engine.Deleter             = memEngine{}
	_ engine.DeadLetterDiscarder = (*Group)(nil)
	_ engine.DeadLetterReader    = (*Group)(nil)
)

// DeleteGroup deletes the group called name on topic: it stops the group's
// consumers as Leave does (each member's onLeave runs once its workers
// exited), forgets its offsets, dead letters and redriven letters, and
// frees the partitions it held, waking the producers blocked on them. The
// group is deleted at once: every later call on it fails with an error
// wrapping ErrSubscription, and the name may be used again, as a new group
// that starts where its Start says. DeleteGroup then waits for the
// deliveries in flight until ctx ends; when it ends first, it returns an
// error wrapping ctx's, and those deliveries finish in the background,
// commit nothing, and free the partitions when they end.
//
// An unknown topic is ErrTopicNotFound, an unknown group ErrSubscription;
// once Close began, ErrClosed.
func (b *Broker) DeleteGroup(ctx context.Context, topic, name string) error {
	b.mu.Lock()
	if b.State() != Running {
		b.mu.Unlock()
		return ErrClosed
	}
	if _, ok := b.topics[topic]; !ok {
		b.mu.Unlock()
		return ErrTopicNotFound
	}
	g, ok := b.groups[groupKey{topic, name}]
	if !ok {
		b.mu.Unlock()
		return fmt.Errorf("%w: no such group", ErrSubscription)
	}
	b.retireLocked(g)
	b.mu.Unlock()
	g.remove(fmt.Errorf("%w: the group was deleted", ErrSubscription))
	defer b.notifyProgress() // a deleted group no longer holds Drain up
	return g.waitRemoved(ctx)
}

// DeleteTopic deletes the topic called name and its groups. Both happen at
// once: from then on publishing to the topic, and every call on its
// groups, fails with an error wrapping ErrTopicNotFound (producers blocked
// on a full partition too), and the name may be created again, as a new
// topic. The groups are deleted as DeleteGroup deletes one, and
// DeleteTopic waits for their deliveries in flight as DeleteGroup does.
//
// An unknown topic is ErrTopicNotFound; once Close began, ErrClosed.
func (b *Broker) DeleteTopic(ctx context.Context, name string) error {
	b.mu.Lock()
	if b.State() != Running {
		b.mu.Unlock()
		return ErrClosed
	}
	t, ok := b.topics[name]
	if !ok {
		b.mu.Unlock()
		return ErrTopicNotFound
	}
	delete(b.topics, name)
	var groups []*Group
	for k, g := range b.groups {
		if k.topic == name {
			groups = append(groups, g)
			b.retireLocked(g)
		}
	}
	t.deleted.Store(true)
	b.mu.Unlock()
	why := fmt.Errorf("%w: the topic was deleted", ErrTopicNotFound)
	for _, p := range t.parts {
		p.seal(why)
	}
	for _, g := range groups {
		g.remove(why)
	}
	defer b.notifyProgress()
	for _, g := range groups {
		if err := g.waitRemoved(ctx); err != nil {
			return err
		}
	}
	return nil
}

// retireLocked takes g out of the registry and forgets its offsets; Close
// still waits for it while a worker of it runs (see forgetRetired). The
// caller holds b.mu and removes g next.
func (b *Broker) retireLocked(g *Group) {
	delete(b.groups, groupKey{g.topic.name, g.name})
	for _, gp := range g.parts {
		b.offsets.forget(OffsetKey{Group: g.name, Topic: g.topic.name, Partition: gp.index})
	}
	if b.retired == nil {
		b.retired = make(map[*Group]struct{})
	}
	b.retired[g] = struct{}{}
}

// forgetRetired drops g from the retired groups once nothing of it runs.
func (b *Broker) forgetRetired(g *Group) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.retired, g)
}

// retiredList is the deleted groups whose workers may still run.
func (b *Broker) retiredList() []*Group {
	b.mu.Lock()
	defer b.mu.Unlock()
	groups := make([]*Group, 0, len(b.retired))
	for g := range b.retired {
		groups = append(groups, g)
	}
	return groups
}

// remove marks the group deleted, for why, and stops it: no worker starts
// again, the running ones are told to stop, their commits fail (the
// cursors are sealed), and every member counts as left. What the group
// holds is let go by settleLocked, now if no worker runs, else when the
// last one exits.
func (g *Group) remove(why error) {
	g.mu.Lock()
	g.deleted.Store(&deletion{err: why})
	for _, gp := range g.parts {
		gp.cursor.Seal()
	}
	g.signalLocked(func(*groupPartition) bool { return true })
	var finish []*member
	for _, m := range g.members {
		m.left = true
		if m.finishLocked() {
			finish = append(finish, m)
		}
	}
	g.broadcastLocked() // a Seek waiting for the partition gives up
	done := g.settleLocked()
	g.mu.Unlock()
	for _, m := range finish {
		g.finishLeave(m)
	}
	if done {
		g.broker.forgetRetired(g)
	}
}

// waitRemoved waits, until ctx ends, for a removed group's workers to exit
// and its members to be told they left.
func (g *Group) waitRemoved(ctx context.Context) error {
	if err := g.waitStopped(ctx); err != nil {
		g.mu.Lock()
		defer g.mu.Unlock()
		return fmt.Errorf("deleted; deliveries still in flight on %s: %w",
			g.partitionsLocked(func(gp *groupPartition) bool { return gp.w != nil }), err)
	}
	return nil
}

// settleLocked lets a deleted group go once no worker serves it: its
// cursors leave their partitions, whose producers blocked on room wake and
// look again without them (see Partition.unsubscribe), and its dead
// letters and redriven letters are dropped. Not before: a worker may hold
// records past its group's cursor, which a partition that no longer counts
// that cursor could reclaim, and reuse, under it. It reports whether the
// group is done with (every member told it left as well), for the caller
// to forget it once mu is released. The caller holds mu.
func (g *Group) settleLocked() (done bool) {
	if g.deleted.Load() == nil || !g.noWorkerLocked(func(*groupPartition) bool { return true })() {
		return false
	}
	if !g.detached {
		g.detached = true
		for _, gp := range g.parts {
			gp.part.unsubscribe(gp.cursor)
			gp.redrive.clear()
		}
		g.dlq.clear()
	}
	return !slices.ContainsFunc(g.members, func(m *member) bool { return !m.gone })
}

// deletedErr is the error of a call on a deleted group, or nil.
func (g *Group) deletedErr() error {
	if d := g.deleted.Load(); d != nil {
		return d.err
	}
	return nil
}

// unsubscribe takes a deleted group's cursor out of the partition: out of
// the low-water mark and the readers waiting for records. The producers
// waiting for room wake and look again without it; when no group is left,
// a full partition trims rather than waits (see roomLocked). The cached
// low-water mark stays right: without a cursor, the minimum can only rise.
func (p *Partition) unsubscribe(c *Cursor) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cursors = slices.DeleteFunc(p.cursors, func(s subscriber) bool { return s.cursor == c })
	p.readers = slices.DeleteFunc(p.readers, func(r reader) bool { return r.cursor == c })
	p.wakeProducersLocked()
}

// DiscardDeadLetters removes the dead letters match accepts (every one when
// match is nil) and returns how many it removed (see
// engine.DeadLetterDiscarder). match runs on copies, under no lock, on the
// caller's goroutine; a letter evicted or redriven meanwhile is not
// removed, nor counted. ctx is checked before each call of match: when it
// ends part way, the letters matched so far are removed and counted, and
// the error wraps ctx's. Once Close began it fails with ErrClosed; once
// the group was deleted, with the deletion's error.
func (g *Group) DiscardDeadLetters(ctx context.Context, match func(*DeadLetter) bool) (int, error) {
	if g.isStopped() {
		return 0, ErrClosed
	}
	if err := g.deletedErr(); err != nil {
		return 0, err
	}
	if match == nil {
		return g.dlq.clear(), nil
	}
	letters, _ := g.dlq.snapshot()
	chosen := make(map[*Record]bool)
	var err error
	for i := range letters {
		if err = ctx.Err(); err != nil {
			err = fmt.Errorf("discarded the letters matched before the context ended: %w", err)
			break
		}
		if match(&letters[i]) {
			chosen[letters[i].Record] = true
		}
	}
	return len(g.dlq.remove(chosen)), err
}

// LatestDeadLetters returns the group's newest n dead letters, newest
// first, copying only those (see engine.DeadLetterReader). n = 0 returns
// none; negative n is ErrInvalid. It never reads short: ctx is for engines
// that must reach a server. Once Close began it fails with ErrClosed; once
// the group was deleted, with the deletion's error.
func (g *Group) LatestDeadLetters(_ context.Context, n int) ([]DeadLetter, error) {
	switch {
	case n < 0:
		return nil, fmt.Errorf("%w: %d dead letters asked for", ErrInvalid, n)
	}
	if err := g.deletedErr(); err != nil {
		return nil, err
	}
	return g.dlq.latest(n), nil
}

// latest copies the newest n letters, newest first.
func (q *deadLetters) latest(n int) []DeadLetter {
	q.mu.Lock()
	defer q.mu.Unlock()
	n = min(n, len(q.letters))
	out := make([]DeadLetter, n)
	for i := range out {
		out[i] = q.letters[len(q.letters)-1-i]
	}
	return out
}

// clear drops every letter and returns how many there were. Evictions
// stay counted.
func (q *deadLetters) clear() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	n := len(q.letters)
	clear(q.letters) // the backing array keeps no record alive
	q.letters = q.letters[:0]
	return n
}

// clear drops the redriven letters waiting.
func (q *redriveQueue) clear() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.items = nil
	q.pending.Store(0)
}

// forget deletes the cursor of k: a group of that name made later starts
// afresh. Whoever holds the old cursor keeps it.
func (s *OffsetStore) forget(k OffsetKey) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.cursors, k)
}
