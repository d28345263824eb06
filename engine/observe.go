package engine

import "time"

// Observer is told what happens inside an engine that the typed layer
// cannot see: retries, dead letters, rebalances, backpressure, records
// dropped, expired or skipped, handlers running too long. The typed layer
// passes one in [Config.Observer] when something listens (hooks, a logger);
// an engine calls it when it is not nil, and otherwise pays nothing but
// that nil check.
//
// An engine calls Observe outside every lock it holds, on the goroutine
// where the event happened (the worker for delivery events, the producer
// for backpressure, drops and expiries), so an observer may call the
// engine's read methods but must not wait for the engine: a worker that
// waits in Observe delays its partition. The Event and what it points to
// are valid only during the call.
type Observer interface {
	Observe(e *Event)
}

// EventKind says what an Event reports, and so which of its fields are
// set.
type EventKind uint8

const (
	// EventRetry: a delivery failed and will be tried again after Delay.
	// Group, Consumer, Partition, Offset, ID, Record, Attempt (the one
	// that failed), Delay, Err.
	EventRetry EventKind = iota + 1
	// EventDeadLetter: a record was given up on. Letter, Consumer, and
	// Count = 1 when the bounded dead-letter queue evicted its oldest
	// letter to make room.
	EventDeadLetter
	// EventRebalance: a group's partitions were dealt out again. Group,
	// Before and After (each consumer's partitions; a consumer that left
	// is only in Before, one that joined only in After).
	EventRebalance
	// EventBackpressureWait: a producer found its Block partition full
	// and began waiting for room. Partition.
	EventBackpressureWait
	// EventBackpressureTimeout: a producer gave up waiting. Partition,
	// Delay (how long it waited), Err (wrapping [ErrBackpressure]).
	EventBackpressureTimeout
	// EventDrop: records were dropped to make room ([DropOldest], or a full
	// partition no group reads). Partition, Count.
	EventDrop
	// EventExpire: records older than [Retention.MaxAge] were trimmed.
	// Partition, Count.
	EventExpire
	// EventSkip: a group found records trimmed before it read them and
	// skipped them. Group, Partition, Offset (the first skipped), To (the
	// offset it resumed at).
	EventSkip
	// EventStuck: a delivery has run longer than [Config.StuckAfter]. Group,
	// Consumer, Partition, Offset, Attempt, Delay (how long it has run, at
	// least StuckAfter). Reported once per delivery.
	EventStuck
	// EventUnstuck: a delivery reported by [EventStuck] has ended. As
	// EventStuck, Delay being about how long it ran.
	EventUnstuck
	// EventMembership: an engine that keeps a group's membership on a
	// server could not follow it (Err: a heartbeat or the reading of the
	// members and their deal failed), or can again after such a failure
	// (Err nil, Delay how long it could not). Group. Reported when that
	// changes, not on every failure; [GroupSnapshot.MembershipErr] holds the
	// latest.
	EventMembership
)

// Event is one thing an engine reports to its Observer. Which fields are
// set depends on Kind; Topic always is.
type Event struct {
	Kind      EventKind
	Topic     string
	Group     string
	Consumer  string
	Partition int
	Offset    int64
	To        int64
	Count     int64
	Attempt   int
	ID        string
	// Record is the record concerned ([EventRetry]), shared with the log:
	// read-only.
	Record *Record
	// Letter is the dead letter ([EventDeadLetter]).
	Letter *DeadLetter
	Delay  time.Duration
	Err    error
	// Before and After are a group's assignment around a rebalance.
	Before, After map[string][]int
}
