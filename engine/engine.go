// Package engine is the boundary between logbus's typed API (package
// [github.com/logbus/logbus/pubsub]) and the engines that store and deliver
// records, on the model of [database/sql/driver]: users never import it; an
// engine author implements it, and users pass the engine's [Driver] to
// pubsub.WithEngine. The in-memory log (the default) and the JetStream
// engine (a module of its own) are built on it, and an engine outside this
// repository can be too: its tests run the conformance suite of
// [github.com/logbus/logbus/pubsub/pubsubtest/conformance] against it.
//
// Everything that crosses the boundary is here: the interfaces an engine
// implements, and the plain data that passes through them (records,
// configurations, counters, dead letters, events, errors).
//
// # Who does what
//
// The typed layer owns everything that is the same for every engine:
// codecs, routing a key to a partition (so a key lands on the same
// partition whatever the engine), splitting a batch into runs per
// partition ([Runs]), and turning records into typed messages. An engine
// owns the log: offsets, retention, groups, delivery, retries, dead
// letters, and keeps the promises the pubsub package documents.
//
// Calls that may block or cross a network take a context and return an
// error. Reads of counters and positions (Stats, Lag, Committed,
// Assignment, DeadLetters) are snapshots an engine may serve from what it
// last observed, and say so in its documentation.
//
// # Optional abilities
//
// Some abilities are optional, asked for with a type assertion, so an
// engine without them still compiles and the typed layer says what it
// does instead: an [Engine] may describe itself at once ([Snapshotter]),
// delete groups and topics ([Deleter]) and answer a ping ([Pinger]); a
// [Topic] may tell a stored record's ID ([RecordIDer]) and take records
// to confirm later ([AsyncAppender]); a [Group] may send
// its dead letters back to itself ([Redriver]), discard them
// ([DeadLetterDiscarder]) and read the newest alone ([DeadLetterReader]);
// an engine may deliver batches ([BatchSubscriber]). The promises only
// some engines keep are declared in [Capabilities]: an option that needs
// one an engine lacks is an error wrapping [ErrInvalid], never a silent
// change of behaviour.
//
// # Stability
//
// The boundary grows by optional interfaces and new fields, so that an
// engine written against it keeps compiling; a change that would break
// one is named in the CHANGELOG.
package engine

import (
	"context"
	"fmt"
	"iter"
	"strings"
	"time"
)

// Driver opens an Engine for a broker: pubsub.NewBroker calls Open once,
// with the broker's configuration (its clock, its IDs, its retry policy,
// its observer), when the broker is made with pubsub.WithEngine(d). It is
// what an engine package returns to its users.
type Driver interface {
	Open(cfg Config) (Engine, error)
}

// Engine creates topics and groups and owns their lifecycle. Its methods
// are safe for concurrent use.
type Engine interface {
	// Capabilities says which of the promises that only some engines keep
	// this one keeps.
	Capabilities() Capabilities
	// CreateTopic creates a topic. A name already taken is [ErrTopicExists];
	// a spec the engine cannot honour, [ErrInvalid].
	CreateTopic(ctx context.Context, name string, spec TopicSpec) (Topic, error)
	// Subscribe adds consumer to group on topic, creating the group with
	// spec on first use; joining with another spec is [ErrSubscription].
	// onLeave, when not nil, is called once the consumer has left and no
	// delivery to it is in flight, by Leave or by Close.
	Subscribe(ctx context.Context, topic, group, consumer string, h Handler, onLeave func(), spec GroupSpec) (Group, error)
	// Group returns an existing group: [ErrTopicNotFound] or [ErrSubscription]
	// when there is none.
	Group(ctx context.Context, topic, group string) (Group, error)
	// Drain returns nil once every group has committed every record
	// published before the call; [ErrStalled] at once for a group with lag
	// that cannot move; ctx's error, wrapped, when ctx ends first.
	Drain(ctx context.Context) error
	// Close refuses new work, drains what can be drained, stops every
	// delivery and returns by the time ctx ends (plus a short grace),
	// reporting what was left in a [*ShutdownError].
	Close(ctx context.Context) error
	// State is the engine's lifecycle stage.
	State() State
}

// Topic is a named, fixed set of partitions.
type Topic interface {
	Name() string
	Partitions() int
	// NewRecord returns an empty record to fill and append. An engine may
	// hand out a record it reclaimed: its Key and Value are then empty
	// slices over buffers the caller may append to, up to their capacity,
	// instead of allocating.
	NewRecord() *Record
	// NewRecords fills recs with records as NewRecord returns them, in one
	// step: the way to get a batch's records.
	NewRecords(recs []*Record)
	// AppendOne stores rec at the end of partition and returns its
	// offset. It blocks only when the partition is full under Block, as
	// Retention says. The record and its bytes belong to the engine
	// afterwards; the caller must not touch them. Headers are the caller's
	// to copy beforehand.
	AppendOne(ctx context.Context, partition int, rec *Record) (int64, error)
	// AppendBatch stores recs[i] at the end of partitions[i], in order, and
	// puts its offset in offsets[i] (all three as long as recs). Each run
	// of consecutive records bound for one partition (see Runs) is stored
	// in one step; every record of the batch gets one Created. It returns
	// how many it stored: all, or with an error the first n. Otherwise as
	// AppendOne.
	AppendBatch(ctx context.Context, partitions []int, recs []*Record, offsets []int64) (int, error)
	// Stats returns every partition's counters, by partition.
	Stats() []PartitionStats
}

// Group is a consumer group on one topic.
type Group interface {
	Name() string
	Leave(ctx context.Context, consumer string) error
	Assignment() map[string][]int
	Pause(ctx context.Context) error
	Resume(ctx context.Context) error
	Seek(ctx context.Context, partition int, offset int64) error
	Replay(ctx context.Context, from Start) error
	Committed(partition int) int64
	Lag() int64
	Stats() GroupStats
	DeadLetters() []DeadLetter
}

// Record is one record of a partition's log, as an engine stores it. While
// it is retained it is shared by every group and must not be written to.
type Record struct {
	Offset  int64
	Key     []byte // nil for a keyless record
	Value   []byte
	Headers map[string]string // nil when there were none
	Created time.Time
	// ID is the record's ID when the publisher set one (an [IDSource]);
	// empty when the engine names it ([Delivery.ID] has it either way).
	ID string
}

// Delivery is one attempt to deliver a record to a consumer. The engine
// fills it and hands it to the consumer's Handler; it, and the Record it
// points to, are valid until the handler returns.
type Delivery struct {
	Topic     string
	Partition int
	ID        string // unique per record, the same for every group and attempt
	Record    *Record
	Attempt   int // 1 on the first delivery to this group in its current epoch
	// Revoked is closed when the group wants the partition back: a pause,
	// a seek or replay, a rebalance that moves it, or Close. A handler
	// that has not yet handed the record to anyone may give it back at
	// once by returning [ErrNotDelivered].
	Revoked <-chan struct{}
}

// Handler processes one delivery: nil acks it, an error (or a panic) is a
// failed attempt, and [ErrAbandoned] or [ErrNotDelivered] give it back
// unsettled. Calls for one partition never overlap, unless the group's
// [GroupSpec.KeyConcurrency] is above 1: then up to that many do, never two
// for records with equal keys. ctx ends only when Close gives up on
// draining.
type Handler func(ctx context.Context, d *Delivery) error

// Capabilities is a set of the promises that only some engines keep: an
// engine declares its own with [Engine.Capabilities], the typed layer refuses
// ([ErrInvalid]) an option that needs one the engine lacks, and the
// conformance suite checks each one an engine declares. Each promise is
// one bit, stated once, below.
type Capabilities uint32

// Has reports whether c has every capability of want.
func (c Capabilities) Has(want Capabilities) bool { return c&want == want }

// The promises that only some engines keep. An option that needs one an
// engine lacks is an error wrapping [ErrInvalid], never silently different
// behaviour.
const (
	// InjectedClock: the engine stamps records, trims by age and dates dead
	// letters with [Config.Clock].
	InjectedClock Capabilities = 1 << iota
	// CustomIDs: the engine names records with [Config.IDs].
	CustomIDs
	// ExactBlock: Block waits for the slowest group to commit, at most
	// BlockTimeout per record, then fails with [ErrBackpressure] naming it.
	ExactBlock
	// ReclaimOnCommit: a full partition frees the records every group has
	// committed past ([PartitionStats.Reclaimed]), so a producer waiting
	// under Block gets room once the slowest group commits. (Whether
	// NewRecord hands out a freed record's buffers is the engine's own
	// affair: see [Topic.NewRecord].)
	ReclaimOnCommit
	// GiveBack: a delivery given back with [ErrNotDelivered] counts no
	// attempt.
	GiveBack
	// VirtualTime: the engine runs inside a testing/synctest bubble, so
	// its waits (backoff, BlockTimeout) are exact in virtual time.
	VirtualTime
	// Observed: the engine reports its events to [Config.Observer].
	Observed
	// StuckDetection: the engine honours [Config.StuckAfter].
	StuckDetection
	// Batches: the engine is a [BatchSubscriber], and delivers a batch
	// consumer's records in batches as [BatchHandler] says.
	Batches
	// DropsOldest: the engine honours [Retention.OnFull] = [DropOldest],
	// counting what it evicts in [PartitionStats.Dropped].
	DropsOldest
	// MaxAge: the engine trims records older than [Retention.MaxAge] (by
	// [Config.Clock] when it has [InjectedClock]).
	MaxAge
	// MaxBytes: the engine bounds the bytes a partition retains by
	// [Retention.MaxBytes], counting at least what [RecordBytes] counts (one
	// that counts its own overhead too holds less). The typed layer
	// refuses a record larger than the bound before it reaches the
	// engine.
	MaxBytes
	// Snapshots: the engine is a Snapshotter.
	Snapshots
	// Redrive: the engine's groups are Redrivers.
	Redrive
	// Delete: the engine is a Deleter.
	Delete
	// DiscardDeadLetters: the engine's groups are DeadLetterDiscarders.
	DiscardDeadLetters
	// GaplessAsync: what a partition stored of its asynchronous publishes
	// is always a prefix of them in append order, whatever fails: once a
	// record fails, none appended before its failure was reported is
	// stored after it (see [AsyncAppender]). An engine that appends
	// asynchronous records with AppendOne, one at a time, keeps it.
	GaplessAsync
	// KeyConcurrency: the engine honours GroupSpec.KeyConcurrency above 1.
	// A group's worker then has up to that many deliveries of one
	// partition in flight at once (its Handler is called concurrently for
	// the partition), never two whose records have equal keys (keyless
	// records are each a key of their own); a record starts only after
	// every earlier record of its key settled (acked or dead-lettered);
	// the committed offset is the lowest unsettled offset; a failed
	// record waiting out its backoff holds back only its key; and no
	// record more than KeyWindowSize records past the committed offset is
	// read. Batch consumers are refused the option with ErrInvalid.
	KeyConcurrency

	endCapabilities // one past the last bit: a new bit goes above, with its name in capabilityNames
)

// AllCapabilities is every capability this version of the package defines
// (a test holds it to the bits above).
const AllCapabilities Capabilities = 1<<18 - 1

// capabilityNames names each bit, by its position: the names String
// gives, for skip messages and logs.
var capabilityNames = [...]string{
	"InjectedClock", "CustomIDs", "ExactBlock", "ReclaimOnCommit", "GiveBack", "VirtualTime", "Observed",
	"StuckDetection", "Batches", "DropsOldest", "MaxAge", "MaxBytes", "Snapshots", "Redrive", "Delete",
	"DiscardDeadLetters", "GaplessAsync", "KeyConcurrency",
}

// String names the capabilities of c, joined by "|" in the order of their
// bits ("VirtualTime|Batches"); "0" for none, and a bit no name is known
// for as its hexadecimal value.
func (c Capabilities) String() string {
	if c == 0 {
		return "0"
	}
	var b strings.Builder
	for i := 0; c != 0; i++ {
		bit := Capabilities(1) << i
		if c&bit == 0 {
			continue
		}
		c &^= bit
		if b.Len() > 0 {
			b.WriteByte('|')
		}
		if i < len(capabilityNames) {
			b.WriteString(capabilityNames[i])
		} else {
			fmt.Fprintf(&b, "%#x", uint32(bit))
		}
	}
	return b.String()
}

// RecordIDer is implemented by a Topic that can tell the ID of a record it
// stored, for the typed layer's publish hooks ([Delivery.ID] is the same
// ID). It is optional. RecordID returns "" when it cannot tell: a record
// named by an [IDSource] that is no longer retained, say.
type RecordIDer interface {
	RecordID(partition int, offset int64) string
}

// Redriver is implemented by a Group that can send its dead letters back
// to itself. It is optional: the typed layer asks for it with a type
// assertion.
type Redriver interface {
	// Redrive removes from the group's dead letters those match accepts
	// (every one when match is nil), oldest first, and delivers each again
	// to this group only, its attempts counted from 1 again; it returns
	// how many it took. match runs under no lock of the engine's. After
	// Close it fails with [ErrClosed].
	Redrive(ctx context.Context, match func(*DeadLetter) bool) (int, error)
}

// Runs yields the runs of a batch routed to partitions: the first index
// and the end of each stretch of consecutive records bound for one
// partition, in order. Every engine splits a batch the same way.
func Runs(partitions []int) iter.Seq2[int, int] {
	return func(yield func(start, end int) bool) {
		for start := 0; start < len(partitions); {
			end := start + 1
			for end < len(partitions) && partitions[end] == partitions[start] {
				end++
			}
			if !yield(start, end) {
				return
			}
			start = end
		}
	}
}
