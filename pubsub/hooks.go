package pubsub

import (
	"context"
	"log/slog"
	"time"

	"github.com/logbus/logbus/internal/enum"
)

// Hook is a value that implements one or more of the Hook* interfaces
// below; [WithHooks] registers it. As in franz-go, a hook implements only
// the events it cares about, the broker sorts the hooks by event once, and
// an event nobody hooks costs a nil check. Rules for every hook:
//
//   - Hooks are called synchronously, on the goroutine where the event
//     happened: the publisher's for publish and backpressure events (and
//     drops and expiries a publish causes; see [HookPublished] for an
//     asynchronous publish), the partition's worker for delivery, retry,
//     dead-letter and skip events (and expiries a read causes), the
//     caller's for rebalance, close and new-broker events, the
//     stuck-handler watchdog's ([WithStuckAfter]) for stuck events, the
//     engine's own for membership events. A slow hook slows that
//     goroutine: a delivery hook delays its whole partition. Hand slow work
//     to a goroutine of your own.
//   - Hooks are called outside every lock of the broker, so they may call
//     the broker's read methods ([Broker.Snapshot], Stats, Lag, Committed,
//     Assignment, DeadLetters) and publish to a topic that does not block.
//     They must not call [Broker.Close], [Broker.Drain], [Topic.Flush],
//     [Group.Leave], Pause, Seek, Replay or Redrive without a ctx deadline:
//     those wait for deliveries or records in flight, perhaps the very one
//     a hook runs in, or for the watchdog a stuck hook runs on.
//   - Hooks must be safe for concurrent use: different partitions raise
//     events at the same time.
//   - A panicking hook is recovered and logged at Error with its stack
//     ([WithLogger]); the event goes on as if it had returned (a publish or
//     a delivery is not failed by it), the other hooks are still called,
//     and its panic is never taken for the handler's.
//   - Several hooks of one kind are called in the order given to
//     WithHooks.
//
// Publish, delivery and close events are raised on every engine. The
// others come from inside the engine, which raises them if it can: the
// in-memory engine does, except membership, which it keeps in process.
type Hook any

// HookNewBroker is called once by [NewBroker], with the broker it built,
// before NewBroker returns (not when an option was invalid). A hook that
// reads the broker later, such as metrics read from [Broker.Snapshot] at
// collection time, keeps it from here.
type HookNewBroker interface {
	OnNewBroker(b *Broker)
}

// PublishInfo describes a record being published, to [HookPublish] and
// [HookPublished].
type PublishInfo struct {
	Topic     string
	Partition int
	// Key is the encoded key (nil for a keyless record) and Size the key
	// and value bytes. Key is read-only, and set only in OnPublish: once
	// the record is stored its bytes belong to the log.
	Key  []byte
	Size int
	// Headers are the record's headers, nil when it has none. OnPublish
	// may add to them, or set a new map when nil: that is how a hook
	// carries a trace context to consumers. In OnPublished they are
	// read-only.
	Headers map[string]string
	// Batch is the number of records of the [Topic.PublishBatch] or
	// PublishValues call that publishes it, 0 for Publish and PublishValue.
	// A batch raises the hooks once per record.
	Batch int
	// ID is the record's [Message.ID], set in OnPublished once it is stored,
	// when the engine can tell (the in-memory engine can, except for an
	// [IDSource]'s record that retention already trimmed).
	ID string
}

// HookPublish is called for each record about to be appended, after it was
// encoded and routed. The context it returns is the one the next hook, and
// [HookPublished], get (for a batch, that record's HookPublished only: the
// batch is appended under the caller's ctx).
type HookPublish interface {
	OnPublish(ctx context.Context, p *PublishInfo) context.Context
}

// HookPublished is called once the append of a record that [HookPublish]
// saw returned: with where it landed, or with the error ([ErrBackpressure],
// [ErrClosed], ctx's error) that kept it out of the log. For a record of
// [Topic.PublishAsync] it is called when the record resolves, stored or
// failed ([ErrAborted], [ErrOutcomeUnknown] included), before its
// [Pending]'s Done closes, on the goroutine that resolves it: the
// publisher's when the engine stores records at once (in memory), an
// engine goroutine when it confirms them later (JetStream), where a slow
// hook delays the outcomes of the records behind it. So every failure of
// an asynchronous publish that got this far reaches it, whether or not
// anyone waits on its Pending.
type HookPublished interface {
	OnPublished(ctx context.Context, p *PublishInfo, pos Position, err error)
}

// DeliveryInfo describes one delivery attempt of a record to a consumer.
type DeliveryInfo struct {
	Topic     string
	Group     string
	Consumer  string
	Partition int
	Offset    int64
	ID        string
	Attempt   int       // 1 on the first delivery to the group
	Created   time.Time // when the record was published
	// Key and Headers are the record's own, shared with the log and every
	// group: read-only, and valid only during the call. Key is nil for a
	// keyless record. In OnStuck they are not known: Key, Headers, ID and
	// Created are empty there, except with [WithKeyConcurrency], where Key
	// and Created are the stuck record's (a copy): the key holding its
	// partition.
	Key     []byte
	Headers map[string]string
}

// HookDeliver is called when a delivery attempt begins, before the value is
// decoded. The context it returns is the one the next hook gets, and then
// the [Handler] (a [Stream]'s consumer has no context: for a Stream it
// reaches [HookDelivered] only).
type HookDeliver interface {
	OnDeliver(ctx context.Context, d *DeliveryInfo) context.Context
}

// HookDelivered is called when a delivery attempt ended, with the context
// [HookDeliver] returned. Implementing it asks the broker to time every
// delivery ([DeliveryResult.Took]): two clock readings per delivery, which
// no one pays when no hook implements it.
type HookDelivered interface {
	OnDelivered(ctx context.Context, d *DeliveryInfo, r DeliveryResult)
}

// Outcome is how a delivery attempt ended.
type Outcome int

const (
	// OutcomeAcked: the handler returned nil (or the Stream consumer
	// acked); the offset is committed.
	OutcomeAcked Outcome = iota
	// OutcomeFailed: the handler returned an error or panicked (Err is a
	// [*PanicError] then). The record is retried or dead-lettered, as
	// [HookRetry] and [HookDeadLetter] then say.
	OutcomeFailed
	// OutcomeUndecodable: the value codec failed (Err is a [*DecodeError]);
	// the handler never ran and the record is dead-lettered.
	OutcomeUndecodable
	// OutcomeGivenBack: a Stream gave the delivery back unsettled (it
	// closed, or the group took the partition back); it will come again.
	OutcomeGivenBack
)

var outcomeNames = []string{OutcomeAcked: "acked", OutcomeFailed: "failed", OutcomeUndecodable: "undecodable",
	OutcomeGivenBack: "given back"}

func (o Outcome) String() string { return enum.Name(outcomeNames, "Outcome", o) }

// DeliveryResult is how a delivery attempt ended, for [HookDelivered].
type DeliveryResult struct {
	Outcome Outcome
	Err     error         // nil when acked
	Took    time.Duration // from the attempt's start to its end
}

// HookRetry is called when a failed delivery will be tried again, before
// the backoff: Delivery.Attempt is the attempt that failed.
type HookRetry interface {
	OnRetry(e RetryEvent)
}

// RetryEvent is a failed attempt that will be retried after Delay.
type RetryEvent struct {
	Delivery DeliveryInfo
	Delay    time.Duration
	Err      error
}

// HookDeadLetter is called when a group gave up on a record and parked it
// in its dead letters.
type HookDeadLetter interface {
	OnDeadLetter(e DeadLetterEvent)
}

// DeadLetterEvent is a record given up on: Delivery.Attempt is the number
// of attempts made, Err the last one's error (a [*DecodeError], a
// [*PanicError] or the handler's). Evicted is set when the group's bounded
// dead-letter queue was full and dropped its oldest letter for this one,
// or, with WithDeadLetterLimit(0), dropped this one (counted in
// [GroupStats.DeadLettersEvicted]).
type DeadLetterEvent struct {
	Delivery DeliveryInfo
	Err      error
	Evicted  bool
}

// HookRebalance is called when a group's partitions were dealt out again,
// after a consumer joined or left; the call that changed the group raises
// it, after the change.
type HookRebalance interface {
	OnRebalance(e RebalanceEvent)
}

// RebalanceEvent is a group's assignment before and after a rebalance: each
// consumer's partitions. A consumer that left is only in Before, one that
// joined only in After.
type RebalanceEvent struct {
	Topic, Group  string
	Before, After map[string][]int
}

// HookBackpressure is called when a producer finds a [Block] partition full
// and begins to wait (Err nil), and when it gives up (Err wraps
// [ErrBackpressure], Waited is how long it waited). A wait that ends in
// room, or with the producer's ctx, raises no second event.
type HookBackpressure interface {
	OnBackpressure(e BackpressureEvent)
}

// BackpressureEvent is a producer waiting for room, or giving up.
type BackpressureEvent struct {
	Topic     string
	Partition int
	Waited    time.Duration
	Err       error
}

// HookDrop is called when records left a partition unread to make room:
// shed by [DropOldest], or trimmed from a full partition no group reads
// (counted in [TopicStats.Dropped]).
type HookDrop interface {
	OnDrop(e TrimEvent)
}

// HookExpire is called when records older than [Retention.MaxAge] were
// trimmed (counted in [TopicStats.Expired]).
type HookExpire interface {
	OnExpire(e TrimEvent)
}

// TrimEvent is Count records trimmed from a partition at once.
type TrimEvent struct {
	Topic     string
	Partition int
	Count     int64
}

// HookSkip is called when a group found records trimmed before it read
// them, and skipped from From to To (counted in [GroupStats.Skipped]).
type HookSkip interface {
	OnSkip(e SkipEvent)
}

// SkipEvent is the records [From, To) of a partition that a group lost to
// retention.
type SkipEvent struct {
	Topic, Group string
	Partition    int
	From, To     int64
}

// HookStuck is called when a delivery has run longer than the
// [WithStuckAfter] threshold (once per delivery), and again with Returned
// set when it ends. It needs WithStuckAfter.
type HookStuck interface {
	OnStuck(e StuckEvent)
}

// StuckEvent is a delivery running too long: Running is how long it has
// run (sampled: at least the threshold, short by up to half of it), or
// when Returned is set about how long it ran.
type StuckEvent struct {
	Delivery DeliveryInfo
	Running  time.Duration
	Returned bool
}

// HookMembership is called when [GroupSnapshot.MembershipErr] is set (the
// broker can no longer follow a group's membership) and when it is cleared
// again (Err nil): once per change, not on every failure. Only an engine
// that keeps membership on a server raises it (the JetStream engine).
type HookMembership interface {
	OnMembership(e MembershipEvent)
}

// MembershipEvent is a change in whether a broker can follow a group's
// membership: Err is why it cannot, or nil once it can again, Lasted then
// being how long it could not.
type MembershipEvent struct {
	Topic, Group string
	Err          error
	Lasted       time.Duration
}

// HookClose is called when the first [Broker.Close] returns, with how long
// it took and what it returned.
type HookClose interface {
	OnClose(e CloseEvent)
}

// CloseEvent is the end of [Broker.Close].
type CloseEvent struct {
	Took time.Duration
	Err  error
}

// WithHooks registers hooks, each a value implementing one or more Hook*
// interfaces ([Hook]), called in the order given. A nil hook, or one that
// implements none of them, makes [NewBroker] report [ErrInvalid] (through
// Err and [NewTopic]). Several WithHooks add up.
func WithHooks(hooks ...Hook) BrokerOption {
	return brokerOptionFunc(func(c *brokerConfig) { c.hooks = append(c.hooks, hooks...) })
}

// WithLogger makes the broker log with l. The default is nil: nothing is
// logged. The levels:
//
//   - Debug: events about one record (a retry, records dropped or
//     expired, a producer waiting for room). Nothing is logged per record
//     on the success path.
//   - Info: rebalances; Pause, Resume, Seek, Replay, Redrive, Leave,
//     DiscardDeadLetters, DeleteGroup and DeleteTopic; Close; a stuck
//     handler that returned.
//   - Warn: a dead letter (with its kind: decode, panic, permanent or
//     exhausted, and whether it evicted the oldest), records skipped, a
//     publish that gave up with ErrBackpressure, a stuck handler.
//   - Error: a handler's recovered panic, with its stack; a hook's panic;
//     a Close that left records behind (one Warn more per partition).
//
// Dead letters, skips, backpressure timeouts and handler panics, which a
// failing consumer or a full partition can repeat at every record, are
// logged at most once a second per group and partition (per topic and
// partition for backpressure); the next record says how many were left
// out (not_logged). Attributes use the OpenTelemetry messaging keys:
// messaging.destination.name, messaging.consumer.group.name,
// messaging.destination.partition.id, messaging.message.id, then offset,
// attempt, error.
//
// Records are logged on the goroutine where the event happened, outside
// the broker's locks, so a slow handler slows that goroutine as a slow
// hook does. A logger costs each delivery a small wrapper (to see a
// handler's panic with its message), but no clock reading.
func WithLogger(l *slog.Logger) BrokerOption {
	return brokerOptionFunc(func(c *brokerConfig) { c.logger = l })
}

// WithStuckAfter makes the broker watch for handlers that run longer than
// d: such a delivery is reported to [HookStuck], logged at Warn, and shows
// Stuck in the [Snapshot], whose RunningFor then says how long deliveries
// have run. It costs the deliveries nothing: one goroutine samples what
// the workers already record, every d/2, so a delivery is reported between
// d and 1.5·d after it began. Without it (d = 0, the default) no goroutine
// runs. Negative d is [ErrInvalid]; so is an engine that cannot watch its
// handlers.
func WithStuckAfter(d time.Duration) BrokerOption {
	return brokerOptionFunc(func(c *brokerConfig) { c.StuckAfter = d })
}
