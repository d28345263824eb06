package pubsub

import (
	"cmp"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/logbus/logbus/engine"
)

// Snapshot is a broker's state at one moment ([Broker.Snapshot]): its
// topics, their partitions, and the groups that read them. It is plain
// data, the caller's own.
type Snapshot struct {
	// Taken is when the snapshot was read: by the [Clock] given with
	// [WithClock], or else time.Now. Lag in time is measured against it.
	Taken time.Time
	State State
	// Partial is set when the engine cannot describe itself: the snapshot
	// then lists the topics and groups made through this Broker with the
	// counters every engine keeps, and the fields only a describing engine
	// fills ([GroupSnapshot.Paused], and in [GroupPartitionSnapshot] Oldest,
	// LagAge, InFlight, Retrying, Attempt, Running, RunningFor, Stuck,
	// Redriving) are zero, OldestUnsettled -1. The in-memory engine fills
	// everything.
	Partial bool
	// Unavailable is set when a remote engine could not reach its server
	// while taking the snapshot ([ErrUnavailable]): the values it could not
	// read are the last it observed, and each topic's and group's Observed
	// says when that was. The in-memory engine never sets it.
	Unavailable bool
	Topics      []TopicSnapshot // by name
}

// TopicSnapshot is one topic in a [Snapshot].
type TopicSnapshot struct {
	Name       string
	Stats      TopicStats          // the sum of the partitions' counters
	Partitions []PartitionSnapshot // by partition
	Groups     []GroupSnapshot     // by name
	// Observed is when the partitions' bounds and counts were read: Taken,
	// or earlier when [Snapshot.Unavailable] (Taken − Observed is how old
	// they are).
	Observed time.Time
}

// PartitionSnapshot is one partition of a topic: its bounds and counters
// ([TopicStats] says what each counts).
type PartitionSnapshot struct {
	Partition     int
	Earliest      int64 // the offset of the oldest retained record
	End           int64 // the offset the next record will get
	Retained      int   // records held
	RetainedBytes int64 // their bytes, as Retention.MaxBytes counts them
	Reclaimed     int64
	Dropped       int64
	Expired       int64
	Blocked       int64
	TimedOut      int64
}

// GroupSnapshot is one consumer group of a topic in a [Snapshot].
type GroupSnapshot struct {
	Name   string
	Paused bool
	// Consumers are the group's consumers, in the order they joined (by
	// name in a Partial snapshot).
	Consumers []string
	// Assignment is each consumer's partitions, as [Group.Assignment].
	Assignment map[string][]int
	Stats      GroupStats
	// DeadLetters is how many dead letters the group holds now (at most
	// its limit, [WithDeadLetterLimit]).
	DeadLetters int
	Lag         int64 // over all partitions, as Group.Lag
	// LagAge is the largest LagAge of its partitions: how long the oldest
	// record the group has not committed has waited.
	LagAge     time.Duration
	Partitions []GroupPartitionSnapshot // by partition
	// Observed is when the oldest of the group's committed offsets (and
	// so its lag) and dead-letter counts was read: Taken, or earlier when
	// [Snapshot.Unavailable].
	Observed time.Time
	// MembershipErr is why this broker cannot follow the group's membership
	// now, when its engine keeps membership on a server (the JetStream
	// engine): the latest failure of a heartbeat, or of reading who is in the
	// group and who owns what; nil once both succeed again, and always with
	// the in-memory engine. Meanwhile the group's partitions stay with the
	// owners the broker last knew, and its members may lose theirs to other
	// brokers when their heartbeats expire. MembershipErrSince is when the
	// failures began. A change is logged (a warning, then "restored" at Info)
	// and raised to [HookMembership].
	MembershipErr      error
	MembershipErrSince time.Time
}

// GroupPartitionSnapshot is a group's state on one partition.
type GroupPartitionSnapshot struct {
	Partition int
	Owner     string // the consumer that owns it; "" when the group has none
	Committed int64  // the next offset the group will read
	Lag       int64  // records not yet committed
	// Oldest is when the oldest record the group has not committed, the one
	// at Committed, was published (its [Message.Created]); zero when Lag is 0
	// or retention already trimmed that record. LagAge is Taken − Oldest,
	// the lag in time (Kafka exporters' "lag seconds"); 0 when Oldest is
	// zero.
	Oldest time.Time
	LagAge time.Duration
	// InFlight is set while a handler (or a Stream's consumer) holds a
	// delivery of this partition, Retrying while a failed record waits out
	// its backoff. Attempt is then the delivery's [Message.Attempt] (in the
	// in-memory engine at most 255: larger counts show as 255), 0
	// otherwise. With [WithKeyConcurrency] they describe the oldest
	// unsettled record alone, the one at Committed.
	InFlight, Retrying bool
	Attempt            int
	// Running is how many deliveries of this partition are in flight: 0
	// or 1, or up to n with [WithKeyConcurrency].
	Running int
	// OldestUnsettled is the offset of the oldest record the group took
	// and has not settled (acked or dead-lettered): in flight, waiting
	// out a backoff, or ([WithKeyConcurrency]) waiting behind an earlier
	// record of its key. The committed offset stops there, so it is
	// Committed; -1 when no record is unsettled.
	OldestUnsettled int64
	// RunningFor is how long the delivery in flight has run, known only
	// with [WithStuckAfter] (else 0). It is sampled, so it may be short by
	// up to half the WithStuckAfter threshold. Stuck is set once it
	// reached the threshold.
	RunningFor time.Duration
	Stuck      bool
	// Redriving is how many dead letters [Group.Redrive] sent back wait to
	// be delivered on this partition.
	Redriving int
}

// Snapshot copies the state of every topic and group of the broker. It is
// how to list a broker's topics and groups, and what metrics and the debug
// page read. It never waits for a handler and holds no lock for longer
// than it takes to copy one partition or one group, so it is not atomic:
// a group's committed offset may be ahead of the topic's counters read a
// moment before. Topics and groups are sorted by name. Safe from a hook or
// a handler too, and after Close.
//
// An engine that cannot describe itself gives a Partial snapshot: see
// [Snapshot.Partial].
func (b *Broker) Snapshot() Snapshot {
	if b == nil || b.eng == nil {
		panic(errNoBroker)
	}
	state := b.State()
	s, ok := ability[engine.Snapshotter](b.caps, engine.Snapshots, b.eng)
	if !ok {
		return b.partialSnapshot(state)
	}
	es := s.Snapshot()
	out := Snapshot{Taken: es.Taken, State: state, Unavailable: es.Unavailable, Topics: make([]TopicSnapshot, len(es.Topics))}
	for i, et := range es.Topics {
		out.Topics[i] = b.topicSnapshot(es.Taken, et)
	}
	return out
}

// topicSnapshot turns an engine's description of a topic into pubsub's.
func (b *Broker) topicSnapshot(taken time.Time, et engine.TopicSnapshot) TopicSnapshot {
	ts := TopicSnapshot{Name: et.Name, Stats: topicStats(et.Partitions), Partitions: make([]PartitionSnapshot, len(et.Partitions)),
		Observed: observedOr(et.Observed, taken)}
	for i, p := range et.Partitions {
		ts.Partitions[i] = PartitionSnapshot{Partition: i, Earliest: p.Earliest, End: p.End, Retained: p.Retained,
			RetainedBytes: p.RetainedBytes, Reclaimed: p.Reclaimed, Dropped: p.Dropped, Expired: p.Expired,
			Blocked: p.Blocked, TimedOut: p.TimedOut}
	}
	stuckAfter := b.obs.stuckAfter()
	for _, eg := range et.Groups {
		gs := GroupSnapshot{Name: eg.Name, Paused: eg.Paused, Consumers: eg.Consumers, Stats: GroupStats(eg.Stats),
			DeadLetters: eg.DeadLetters, Assignment: make(map[string][]int, len(eg.Consumers)),
			Partitions: make([]GroupPartitionSnapshot, len(eg.Partitions)), Observed: observedOr(eg.Observed, taken),
			MembershipErr: eg.MembershipErr, MembershipErrSince: eg.MembershipErrSince}
		for _, c := range eg.Consumers {
			gs.Assignment[c] = []int{}
		}
		for i, ep := range eg.Partitions {
			p := GroupPartitionSnapshot{Partition: ep.Partition, Owner: ep.Owner, Committed: ep.Committed, Lag: ep.Lag,
				Oldest: ep.Oldest, InFlight: ep.InFlight, Retrying: ep.Retrying, Attempt: ep.Attempt,
				Running: ep.Running, OldestUnsettled: ep.OldestUnsettled, RunningFor: ep.RunningFor, Redriving: ep.Redriving}
			if !p.Oldest.IsZero() {
				p.LagAge = max(0, taken.Sub(p.Oldest))
			}
			p.Stuck = stuckAfter > 0 && p.InFlight && p.RunningFor >= stuckAfter
			if p.Owner != "" {
				gs.Assignment[p.Owner] = append(gs.Assignment[p.Owner], p.Partition)
			}
			gs.Lag += p.Lag
			gs.LagAge = max(gs.LagAge, p.LagAge)
			gs.Partitions[i] = p
		}
		ts.Groups = append(ts.Groups, gs)
	}
	return ts
}

// observedOr is when an engine read a value: observed, or taken for an
// engine that holds its values itself (it leaves Observed zero).
func observedOr(observed, taken time.Time) time.Time {
	if observed.IsZero() {
		return taken
	}
	return observed
}

// topicStats sums a topic's partition counters.
func topicStats(parts []engine.PartitionStats) TopicStats {
	var s TopicStats
	for _, p := range parts {
		s.Published += p.End
		s.Retained += p.Retained
		s.RetainedBytes += p.RetainedBytes
		s.Reclaimed += p.Reclaimed
		s.Dropped += p.Dropped
		s.Expired += p.Expired
		s.Blocked += p.Blocked
		s.TimedOut += p.TimedOut
	}
	return s
}

// registry remembers the topics and groups made through a Broker: for the
// Partial snapshot of an engine that cannot describe itself, and to tell a
// typed Topic that its group, or itself, was deleted.
type registry struct {
	mu     sync.Mutex
	topics map[string]*registered
}

type registered struct {
	topic  engine.Topic
	typed  typedTopic // the *Topic[K, V] NewTopic returned
	groups map[string]engine.Group
}

// typedTopic is what the registry needs of a *Topic[K, V].
type typedTopic interface {
	forgetGroup(name string) // the group was deleted: Subscribe makes a new handle
	markDeleted()            // the topic was deleted: its handle fails from now on
}

func (r *registry) addTopic(t engine.Topic, typed typedTopic) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.topics == nil {
		r.topics = make(map[string]*registered)
	}
	r.topics[t.Name()] = &registered{topic: t, typed: typed, groups: make(map[string]engine.Group)}
}

func (r *registry) addGroup(topic string, g engine.Group) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if t := r.topics[topic]; t != nil {
		t.groups[g.Name()] = g
	}
}

// removeGroup forgets a deleted group. The typed Topic is told outside
// r.mu: it takes its own lock.
func (r *registry) removeGroup(topic, group string) {
	r.mu.Lock()
	t := r.topics[topic]
	if t != nil {
		delete(t.groups, group)
	}
	r.mu.Unlock()
	if t != nil {
		t.typed.forgetGroup(group)
	}
}

// removeTopic forgets a deleted topic and its groups, and marks its typed
// Topic deleted, so the name may be created again without the old handle
// reaching the new topic.
func (r *registry) removeTopic(topic string) {
	r.mu.Lock()
	t := r.topics[topic]
	delete(r.topics, topic)
	r.mu.Unlock()
	if t != nil {
		t.typed.markDeleted()
	}
}

// partialSnapshot describes the topics and groups made through b with
// what every engine reports.
func (b *Broker) partialSnapshot(state State) Snapshot {
	out := Snapshot{Taken: time.Now(), State: state, Partial: true}
	b.reg.mu.Lock()
	var et []engine.TopicSnapshot
	groups := make(map[string][]engine.Group)
	for name, r := range b.reg.topics {
		et = append(et, engine.TopicSnapshot{Name: name, Partitions: nil})
		for _, g := range r.groups {
			groups[name] = append(groups[name], g)
		}
		et[len(et)-1].Partitions = r.topic.Stats()
	}
	b.reg.mu.Unlock()
	slices.SortFunc(et, func(x, y engine.TopicSnapshot) int { return cmp.Compare(x.Name, y.Name) })
	for _, t := range et {
		gs := groups[t.Name]
		slices.SortFunc(gs, func(x, y engine.Group) int { return cmp.Compare(x.Name(), y.Name()) })
		for _, g := range gs {
			t.Groups = append(t.Groups, describeGroup(g, t.Partitions))
		}
		out.Topics = append(out.Topics, b.topicSnapshot(out.Taken, t))
	}
	return out
}

// describeGroup builds what an engine without a Snapshot can say of a
// group: its assignment, offsets, lag and counters.
func describeGroup(g engine.Group, parts []engine.PartitionStats) engine.GroupSnapshot {
	assignment := g.Assignment()
	gs := engine.GroupSnapshot{Name: g.Name(), Stats: g.Stats(), DeadLetters: len(g.DeadLetters()),
		Consumers: slices.Sorted(maps.Keys(assignment)), Partitions: make([]engine.GroupPartitionSnapshot, len(parts))}
	for c, owned := range assignment {
		for _, p := range owned {
			if p >= 0 && p < len(parts) {
				gs.Partitions[p].Owner = c
			}
		}
	}
	for i, ps := range parts {
		p := &gs.Partitions[i]
		p.Partition, p.Committed, p.OldestUnsettled = i, g.Committed(i), -1
		p.Lag = max(0, ps.End-p.Committed)
	}
	return gs
}
