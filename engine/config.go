package engine

import (
	"fmt"
	"math"
	"time"

	"github.com/logbus/logbus/internal/enum"
)

// FullPolicy is what a full partition does with a new record.
type FullPolicy int

const (
	// Block makes the producer wait for the groups to make room, at most
	// BlockTimeout and never past its context, then fail with
	// [ErrBackpressure]. A partition no group reads never waits: see
	// Partition.
	Block FullPolicy = iota
	// DropOldest evicts the oldest record, read or not, and counts it.
	DropOldest
)

var fullPolicyNames = []string{Block: "Block", DropOldest: "DropOldest"}

func (f FullPolicy) String() string { return enum.Name(fullPolicyNames, "FullPolicy", f) }

// Retention bounds a partition. Zero fields mean the defaults.
type Retention struct {
	MaxMessages  int           // records held at most; default 1024, at most MaxTopicMessages
	MaxAge       time.Duration // trim records older than this; 0 keeps them
	OnFull       FullPolicy    // default Block
	BlockTimeout time.Duration // longest wait for room under Block; default 1s
	MaxBytes     int64         // bytes held at most, as RecordBytes counts them; 0 means no byte bound
}

// RecordBytes is what a record counts against [Retention.MaxBytes]: its key,
// its value, and the keys and values of its headers. The record's own
// bookkeeping is not counted. Headers count because they are payload a
// publisher chooses: uncounted, a partition bounded at 64 KiB held 255 MiB
// of them.
func RecordBytes(rec *Record) int64 {
	n := int64(len(rec.Key) + len(rec.Value))
	if rec.Headers != nil {
		n += headerBytes(rec.Headers)
	}
	return n
}

// DescribeSize says what rec counts against [Retention.MaxBytes], part by
// part, for an error: "11 bytes (key 3 + value 8)", with "+ headers n" when
// it has headers.
func DescribeSize(rec *Record) string {
	if rec.Headers == nil {
		return fmt.Sprintf("%d bytes (key %d + value %d)", RecordBytes(rec), len(rec.Key), len(rec.Value))
	}
	return fmt.Sprintf("%d bytes (key %d + value %d + headers %d)",
		RecordBytes(rec), len(rec.Key), len(rec.Value), headerBytes(rec.Headers))
}

// headerBytes is the bytes of h's keys and values. Apart from [RecordBytes]
// so that a record without headers costs a nil check.
func headerBytes(h map[string]string) int64 {
	var n int64
	for k, v := range h {
		n += int64(len(k) + len(v))
	}
	return n
}

// Defaults of Retention.
const (
	DefaultMaxMessages  = 1024
	DefaultBlockTimeout = time.Second
)

// Resolve checks r and fills its zero fields with the defaults. It is where
// a retention is validated; the limits that also depend on the partition
// count are checked by [TopicSpec.Resolve].
func (r Retention) Resolve() (Retention, error) {
	switch {
	case r.MaxMessages < 0:
		return r, fmt.Errorf("%w: retention MaxMessages %d is negative", ErrInvalid, r.MaxMessages)
	case r.MaxMessages > MaxTopicMessages: // a partition holds no more than its topic
		return r, fmt.Errorf("%w: retention MaxMessages %d is over the limit of %d records a topic may hold (MaxTopicMessages)",
			ErrInvalid, r.MaxMessages, MaxTopicMessages)
	case r.MaxBytes < 0:
		return r, fmt.Errorf("%w: retention MaxBytes %d is negative", ErrInvalid, r.MaxBytes)
	case r.MaxAge < 0:
		return r, fmt.Errorf("%w: retention MaxAge %v is negative", ErrInvalid, r.MaxAge)
	case r.BlockTimeout < 0:
		return r, fmt.Errorf("%w: retention BlockTimeout %v is negative", ErrInvalid, r.BlockTimeout)
	case r.OnFull != Block && r.OnFull != DropOldest:
		return r, fmt.Errorf("%w: retention OnFull %v", ErrInvalid, r.OnFull)
	}
	if r.MaxMessages == 0 {
		r.MaxMessages = DefaultMaxMessages
	}
	if r.BlockTimeout == 0 {
		r.BlockTimeout = DefaultBlockTimeout
	}
	return r, nil
}

// PartitionStats counts what happened to one partition's records.
type PartitionStats struct {
	Earliest int64 // offset of the oldest retained record
	End      int64 // offset the next record will get
	Retained int   // records held now
	// RetainedBytes is the bytes of the records held now ([RecordBytes]),
	// what [Retention.MaxBytes] bounds.
	RetainedBytes int64
	Reclaimed     int64 // records freed after every group had committed past them
	Dropped       int64 // records DropOldest evicted, or trimmed from a full partition no group reads
	Expired       int64 // records MaxAge trimmed
	Blocked       int64 // publishes that had to wait for room
	TimedOut      int64 // publishes that gave up with ErrBackpressure
}

// RetryPolicy says how often a failing delivery is retried and how long the
// worker waits in between. Zero fields mean the defaults.
type RetryPolicy struct {
	MaxAttempts int           // deliveries before dead-lettering, first one included; default 3
	BaseDelay   time.Duration // wait after the first failure; default 10ms
	Multiplier  float64       // growth per further failure; default 2
	MaxDelay    time.Duration // cap on any one wait; default 1s
}

// Defaults of [RetryPolicy].
const (
	DefaultMaxAttempts = 3
	DefaultBaseDelay   = 10 * time.Millisecond
	DefaultMultiplier  = 2.0
	DefaultMaxDelay    = time.Second
)

// Resolve checks p and fills its zero fields with the defaults.
func (p RetryPolicy) Resolve() (RetryPolicy, error) {
	switch {
	case p.MaxAttempts < 0:
		return p, fmt.Errorf("%w: retry MaxAttempts %d is negative", ErrInvalid, p.MaxAttempts)
	case p.BaseDelay < 0:
		return p, fmt.Errorf("%w: retry BaseDelay %v is negative", ErrInvalid, p.BaseDelay)
	case p.MaxDelay < 0:
		return p, fmt.Errorf("%w: retry MaxDelay %v is negative", ErrInvalid, p.MaxDelay)
	case p.Multiplier != 0 && (p.Multiplier < 1 || math.IsNaN(p.Multiplier) || math.IsInf(p.Multiplier, 0)):
		return p, fmt.Errorf("%w: retry Multiplier %v must be at least 1", ErrInvalid, p.Multiplier)
	}
	if p.MaxAttempts == 0 {
		p.MaxAttempts = DefaultMaxAttempts
	}
	if p.BaseDelay == 0 {
		p.BaseDelay = DefaultBaseDelay
	}
	if p.Multiplier == 0 {
		p.Multiplier = DefaultMultiplier
	}
	if p.MaxDelay == 0 {
		p.MaxDelay = DefaultMaxDelay
	}
	return p, nil
}

// Delay is the wait after the given failed attempt (1 for the first):
// min(MaxDelay, BaseDelay·Multiplier^(attempt−1)). There is no jitter: one
// in-process worker per partition has nobody to collide with.
func (p RetryPolicy) Delay(attempt int) time.Duration {
	if attempt < 1 {
		attempt = 1
	}
	d := float64(p.BaseDelay) * math.Pow(p.Multiplier, float64(attempt-1))
	if d >= float64(p.MaxDelay) { // also catches +Inf
		return p.MaxDelay
	}
	return time.Duration(d)
}

// TopicSpec is what a topic is created with. Zero fields mean the defaults.
// How records are routed to partitions is not part of it: the typed layer
// routes, the same way for every engine.
type TopicSpec struct {
	Partitions int       // fixed for the topic's life; default 1
	Retention  Retention // per partition
}

// The limits of a topic's shape. A topic allocates its partitions when it
// is created, each with a ring slot (and a little more) per record of
// MaxMessages, committed at once whether or not records come (pubsub's
// Retention says what each costs). Without limits, a typo became an
// out-of-memory crash or a NewTopic that did not return: 1,000,000
// partitions of the default 1024 records ask for about 10 GB of
// bookkeeping. Past these limits a topic is [ErrInvalid], naming the limit,
// before anything is allocated.
//
//   - [MaxPartitions] (65,536): partitions are the unit of parallelism, and
//     each group runs a goroutine per partition (a few KiB of stack each);
//     65,536 is far more than the cores of any machine can use, and their
//     fixed cost stays in the tens of MiB.
//   - [MaxTopicMessages] (16 Mi): partitions × MaxMessages, the ring slots
//     NewTopic commits at once, 128 MiB of them. Measured on a loaded
//     2-core machine: 130 MiB allocated in 5-330 ms for one partition of
//     16 Mi, 188 MiB in 0.09-2.4 s for 65,536 partitions of 256, against
//     520-640 MiB in 0.2-3.6 s at 64 Mi slots. Full, at even 100 bytes a
//     record, 16 Mi records retain well over 2 GiB: past what an
//     in-process log is for.
//
// MaxMessages alone is held to MaxTopicMessages too, so the product is
// computed without overflow.
const (
	MaxPartitions    = 1 << 16
	MaxTopicMessages = 1 << 24
)

// Resolve checks c and fills its zero fields with the defaults: with
// [Retention.Resolve], the one place a topic's configuration is validated.
func (c TopicSpec) Resolve(name string) (TopicSpec, error) {
	switch {
	case name == "":
		return c, fmt.Errorf("%w: empty topic name", ErrInvalid)
	case c.Partitions < 0:
		return c, fmt.Errorf("%w: %d partitions", ErrInvalid, c.Partitions)
	case c.Partitions > MaxPartitions:
		return c, fmt.Errorf("%w: %d partitions, over the limit of %d (MaxPartitions)",
			ErrInvalid, c.Partitions, MaxPartitions)
	}
	if c.Partitions == 0 {
		c.Partitions = 1
	}
	ret, err := c.Retention.Resolve()
	if err != nil {
		return c, err
	}
	c.Retention = ret
	// Both factors are bounded above (Resolve checked MaxMessages), so the
	// product fits in an int64.
	if slots := int64(c.Partitions) * int64(ret.MaxMessages); slots > MaxTopicMessages {
		return c, fmt.Errorf("%w: %d partitions × MaxMessages %d = %d records, over the limit of %d (MaxTopicMessages)",
			ErrInvalid, c.Partitions, ret.MaxMessages, slots, MaxTopicMessages)
	}
	return c, nil
}

// GroupSpec is what a group is created with. Zero fields mean the defaults.
type GroupSpec struct {
	Retry           RetryPolicy // zero: the broker's policy
	DeadLetterLimit int         // dead letters kept, oldest evicted first; 0: DefaultDeadLetterLimit; NoDeadLetters: none
	Start           Start       // where the group begins in every partition; zero: Earliest
	// KeyConcurrency is how many records of one partition the group's
	// consumer may handle at once, never two with equal keys (see the
	// KeyConcurrency capability); 0 is 1, one at a time. At most
	// MaxKeyConcurrency. An engine without the capability refuses a value
	// above 1 with ErrInvalid (the typed layer refuses it first).
	KeyConcurrency int
}

// MaxKeyConcurrency bounds GroupSpec.KeyConcurrency: 256 deliveries of
// one partition at once, each with a goroutine of its own, and a window
// of 4096 records (16 per delivery) that one slow key can hold back.
const MaxKeyConcurrency = 256

// KeyWindowSize is the window of a group with key concurrency n: how many
// records of a partition, from its committed offset on, the group may
// have read and not settled: max(64, 16n). A record that stays unsettled
// (a slow handler, a retry's backoff) lets the other keys run up to that
// many records past it; then the partition waits for it. 16 records per
// delivery keep n deliveries busy while a few keys hold records back; 64
// is the least the typed layer promises.
func KeyWindowSize(n int) int { return max(64, 16*n) }

// Resolve checks c and fills its zero fields as the group will use them:
// Retry, when zero, is retry (the broker's policy, already resolved), and
// is resolved otherwise; DeadLetterLimit 0 is [DefaultDeadLetterLimit] (and
// [NoDeadLetters] stays as it is); KeyConcurrency 0 is 1. It is where a
// group's configuration is validated; two specs that resolve
// [GroupSpec.Equal] configure the same group.
func (c GroupSpec) Resolve(retry RetryPolicy) (GroupSpec, error) {
	if c.Retry == (RetryPolicy{}) {
		c.Retry = retry
	} else {
		r, err := c.Retry.Resolve()
		if err != nil {
			return c, err
		}
		c.Retry = r
	}
	switch {
	case c.DeadLetterLimit < 0 && c.DeadLetterLimit != NoDeadLetters:
		return c, fmt.Errorf("%w: dead-letter limit %d is negative", ErrInvalid, c.DeadLetterLimit)
	case c.DeadLetterLimit == 0:
		c.DeadLetterLimit = DefaultDeadLetterLimit
	}
	switch {
	case c.KeyConcurrency < 0:
		return c, fmt.Errorf("%w: key concurrency %d is negative", ErrInvalid, c.KeyConcurrency)
	case c.KeyConcurrency > MaxKeyConcurrency:
		return c, fmt.Errorf("%w: key concurrency %d is over the limit of %d (MaxKeyConcurrency)", ErrInvalid, c.KeyConcurrency, MaxKeyConcurrency)
	case c.KeyConcurrency == 0:
		c.KeyConcurrency = 1
	}
	return c, c.Start.Validate()
}

// Equal reports whether c and o configure a group the same way.
// KeyConcurrency 0 and 1 are the same: a spec an engine stored before the
// field existed still equals the one Resolve makes.
func (c GroupSpec) Equal(o GroupSpec) bool {
	return c.Retry == o.Retry && c.DeadLetterLimit == o.DeadLetterLimit && c.Start.Equal(o.Start) &&
		max(1, c.KeyConcurrency) == max(1, o.KeyConcurrency)
}

// StartKind says how a Start picks an offset.
type StartKind int8

const (
	StartEarliest StartKind = iota // the oldest retained record
	StartLatest                    // the end: only records published later
	StartOffset                    // Start.Offset, clamped to the retained range
	StartTime                      // the first record whose Created is at or after Start.Time
)

// Start says where a group reads from in a partition. The zero Start is
// [StartEarliest].
type Start struct {
	Kind   StartKind
	Offset int64
	Time   time.Time
}

// Equal reports whether s and o start at the same place.
func (s Start) Equal(o Start) bool {
	return s.Kind == o.Kind && s.Offset == o.Offset && s.Time.Equal(o.Time)
}

func (s Start) String() string {
	switch s.Kind {
	case StartEarliest:
		return "earliest"
	case StartLatest:
		return "latest"
	case StartOffset:
		return fmt.Sprintf("offset %d", s.Offset)
	case StartTime:
		return "time " + s.Time.Format(time.RFC3339Nano)
	}
	return fmt.Sprintf("Start(%d)", s.Kind)
}

// Validate reports a Start no engine can honour: an unknown kind, a
// negative offset.
func (s Start) Validate() error {
	switch {
	case s.Kind < StartEarliest || s.Kind > StartTime:
		return fmt.Errorf("%w: unknown start %v", ErrInvalid, s)
	case s.Kind == StartOffset && s.Offset < 0:
		return fmt.Errorf("%w: start at negative offset %d", ErrInvalid, s.Offset)
	}
	return nil
}

// GroupStats counts what a group's workers did. The counters belong to the
// group, not to a worker, so they survive rebalances.
type GroupStats struct {
	Delivered          int64 // records acked
	Retried            int64 // failed attempts that were retried
	DeadLettered       int64 // records given up on
	Skipped            int64 // records trimmed by retention before the group read them
	DeadLettersEvicted int64 // dead letters pushed out of the bounded queue
	Redriven           int64 // dead letters sent back by Redrive
}

// DeadLetter is a record a group gave up on, and why. Record is a copy of
// its own, which outlives the log's.
type DeadLetter struct {
	Record    *Record
	ID        string
	Topic     string
	Partition int
	Group     string
	Attempts  int   // deliveries made, the last one included
	Err       error // the last attempt's error
	FailedAt  time.Time
	// Truncated is set when the engine could not store the whole record
	// with the letter (a distributed engine's server limits the size of
	// what it stores) and kept it without its value ([Record.Value] empty),
	// or also without its key and headers (nil); ValueSize is then the
	// value's length in bytes. An engine that keeps every letter whole
	// leaves both zero.
	Truncated bool
	ValueSize int
}

// DefaultDeadLetterLimit is how many dead letters a group keeps by default.
const DefaultDeadLetterLimit = 1024

// NoDeadLetters is the DeadLetterLimit of a group that keeps no dead
// letters (pubsub.WithDeadLetterLimit(0)): each record it gives up on is
// counted as dead-lettered and as evicted at once, and observed, but not
// kept. An engine that cannot honour it refuses it with [ErrInvalid], as it
// does any other negative limit.
const NoDeadLetters = -1

// State is a broker's lifecycle stage.
type State int32

const (
	Running  State = iota // accepting work
	Draining              // Close began: no new publishes or subscriptions; workers finishing
	Stopped               // Close finished: every worker has exited
)

var stateNames = []string{Running: "running", Draining: "draining", Stopped: "stopped"}

func (s State) String() string { return enum.Name(stateNames, "State", s) }

// Config is what an engine is created with. Zero fields mean the defaults.
type Config struct {
	Clock Clock       // default: time.Now, read once per ClockResolution while in use (see coarseClock)
	IDs   IDSource    // default: records are named by position (see recordIDs)
	Retry RetryPolicy // every group's, unless the group sets its own
	// Observer, when not nil, is told of the engine's events (see
	// Observer). An engine that reports them has the Observed capability;
	// one that does not ignores it.
	Observer Observer
	// StuckAfter, when positive, makes the engine report a delivery
	// running longer than this ([EventStuck]) and say how long deliveries
	// have run in its Snapshot. Only an engine with the [StuckDetection]
	// capability does; the typed layer refuses it for the others.
	StuckAfter time.Duration
}

// Clock reads the time. The broker stamps records with it, trims by age with
// it and dates dead letters with it. Waiting (backoff, BlockTimeout) uses the
// runtime's timers, which testing/synctest virtualises.
type Clock interface{ Now() time.Time }

// IDSource hands out record IDs. NextID is called once per publish, from
// many goroutines at once, and must return a value it never returned before.
// Without one, the broker names records by position; see recordIDs.
type IDSource interface{ NextID() string }
