package engine

import "time"

// Snapshotter is implemented by an engine that can describe all its topics
// and groups at once. It is optional: the typed layer asks for it with a
// type assertion, and says what a Broker reports when its engine has none.
type Snapshotter interface {
	// Snapshot copies the engine's state. It never waits for a handler
	// and holds no lock for longer than it takes to copy one partition's
	// or one group's state, so the snapshot is not atomic across them: a
	// group's committed offset may be a little ahead of its topic's
	// counters taken a moment earlier. Safe for concurrent use, and after
	// Close.
	Snapshot() Snapshot
}

// Snapshot is an engine's state at one time: plain data, the caller's own.
type Snapshot struct {
	// Taken is when the snapshot was read, by the engine's clock (the one
	// that measures records' ages); lag in time is measured against it.
	Taken time.Time
	// Unavailable is set when the engine could not reach what it depends
	// on (its server) while taking the snapshot: the values it could not
	// read are the last it observed, and each topic's and group's
	// Observed says when that was. An engine that depends on nothing never
	// sets it.
	Unavailable bool
	Topics      []TopicSnapshot // by name
}

// TopicSnapshot is one topic and the groups that read it.
type TopicSnapshot struct {
	Name       string
	Partitions []PartitionStats // by partition
	Groups     []GroupSnapshot  // by name
	// Observed is when the oldest of the partitions' values was read
	// from the engine's server; zero for an engine that holds them
	// itself (they are current).
	Observed time.Time
}

// GroupSnapshot is one consumer group of a topic.
type GroupSnapshot struct {
	Name      string
	Paused    bool
	Consumers []string // in the order they joined
	Stats     GroupStats
	// DeadLetters is how many dead letters the group holds now (at most
	// its limit; Stats counts the evicted ones).
	DeadLetters int
	Partitions  []GroupPartitionSnapshot // by partition
	// Observed is when the oldest of the group's values from the server
	// (Committed and Lag of each partition, DeadLetters,
	// Stats.DeadLettersEvicted) was read; zero for an engine that holds
	// them itself (they are current).
	Observed time.Time
	// MembershipErr is why this broker cannot follow the group's
	// membership now, for an engine that keeps it on a server (see
	// [EventMembership]): the latest failure of a heartbeat or of reading
	// the members and their deal, nil once both succeed again, and always
	// for an engine that keeps membership in process. MembershipErrSince
	// is when the failures began.
	MembershipErr      error
	MembershipErrSince time.Time
}

// GroupPartitionSnapshot is a group's state on one partition.
type GroupPartitionSnapshot struct {
	Partition int
	Owner     string // the consumer that owns the partition; "" when none does
	Committed int64  // the next offset the group will read
	Lag       int64  // records not yet committed: end − Committed, at least 0
	// Oldest is when the oldest record the group has not committed was
	// created (its Created): Taken − Oldest is the lag in time. Zero when
	// Lag is 0, or when that record is no longer retained (the group will
	// skip it).
	Oldest time.Time
	// InFlight is set while a handler runs for this partition, and
	// Retrying while the record waits out a retry backoff; Attempt is then
	// the attempt running or failed last (saturating at 255 in the
	// in-memory engine), 0 otherwise. The record is the one at Committed,
	// or a redriven dead letter. With key concurrency (GroupSpec.
	// KeyConcurrency above 1) they describe that record alone, the oldest
	// unsettled one, which holds the committed offset.
	InFlight, Retrying bool
	Attempt            int
	// Running is how many deliveries of this partition are in flight: 0
	// or 1, or up to the group's key concurrency.
	Running int
	// OldestUnsettled is the offset of the oldest record the group took
	// and has not settled (acked or dead-lettered): in flight, waiting
	// out a backoff, or with key concurrency waiting behind an earlier
	// record of its key. It is Committed, since the committed offset stops
	// there; -1 when no record is unsettled.
	OldestUnsettled int64
	// RunningFor is how long the delivery in flight has run, when the
	// engine watches for stuck handlers ([Config.StuckAfter]); 0 when it
	// does not know. It is measured by sampling, so it may be short by up
	// to half of StuckAfter.
	RunningFor time.Duration
	// Redriving is how many redriven dead letters wait to be delivered
	// again on this partition (see Redriver).
	Redriving int
}
