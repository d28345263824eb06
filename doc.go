// Package logbus is a typed, in-process publish/subscribe message queue with
// the semantics of a Kafka log: partitioned topics, consumer groups with
// committed offsets, at-least-once delivery with retries and dead letters,
// bounded buffers with explicit backpressure, replay, and a graceful
// shutdown that drains before it stops.
//
// This package holds only documentation. The API is in package
// [github.com/logbus/logbus/pubsub], the codecs that turn values into bytes
// in [github.com/logbus/logbus/codec], and test helpers in
// [github.com/logbus/logbus/pubsub/pubsubtest].
//
// # A tour
//
// A [pubsub.Broker] owns topics, groups and the goroutines that deliver.
// A topic carries keys of one type and values of another; the codecs fix
// both:
//
//	b := pubsub.NewBroker()
//	defer b.Close(ctx)
//
//	orders, err := pubsub.NewTopic(b, "orders", codec.String(), codec.JSON[Order](),
//		pubsub.WithPartitions(4),
//		pubsub.WithRetention(pubsub.Retention{MaxMessages: 4096, OnFull: pubsub.Block}))
//
// Producers publish; Publish returns once the record is in the log, with its
// partition and offset:
//
//	pos, err := orders.Publish(ctx, order.Customer, order)
//
// Many records at once go through PublishBatch (or PublishValues for
// keyless ones): the same routing and per-key order as one Publish each, at
// a lower cost per record, since each partition's lock and wake-up are
// shared by the batch.
//
// PublishAsync does not wait for the engine's confirmation: it returns a
// Pending that resolves once the record is stored or has failed, and Flush
// waits for every record issued before it and says how many failed. A
// partition stores asynchronous records in call order, and when one fails
// the ones behind it fail too ([pubsub.ErrAborted]), so what it stored is a
// prefix of what was issued. In memory a record is stored before
// PublishAsync returns; on a remote engine (JetStream) many records are in
// flight at once, up to [pubsub.WithMaxInFlight]:
//
//	for _, o := range batch {
//		orders.PublishAsync(ctx, o.Customer, o) // or keep the *Pending to Wait on it
//	}
//	if err := orders.Flush(ctx); err != nil { // "3 records failed, the first: ..."
//		return err
//	}
//
// Consumers join named groups. Every group sees every record; inside a group
// each partition, and so each record, goes to one consumer:
//
//	billing, err := orders.Subscribe("billing", "billing-1", pubsub.HandlerFunc[Order](
//		func(ctx context.Context, msg pubsub.Message[Order]) error {
//			return charge(ctx, msg.Value) // nil acks; an error retries, then dead-letters
//		}))
//
// A consumer can also take its messages from a channel, acking each one
// ([pubsub.Topic.Stream]), or in batches: [pubsub.Topic.SubscribeBatch]
// hands a [pubsub.BatchHandler] what a partition gained since it last
// looked, in offset order, and the group commits once per batch; a
// [pubsub.BatchError] says which message failed, and only that one is
// retried. A group can pause, resume, seek and replay, and it
// reports its lag, its counters and its dead letters. A handler that needs
// the typed key asks the topic: orders.Key(msg).
//
// # Where a group starts, and moving it
//
// A new group starts at the oldest retained record, or where
// [pubsub.StartAt] says: [pubsub.Earliest], [pubsub.Latest] (only what is
// published from now on), [pubsub.AtOffset] or [pubsub.AtTime]. The start is
// applied when Subscribe creates the group, before any delivery, so no
// record before it is ever delivered. A group's options are fixed by the
// call that created it: joining it with other options is an error wrapping
// [pubsub.ErrSubscription], never silently ignored.
//
// Group.Pause, Seek, Replay (which takes the same Start values, so a group
// can replay by time) and Leave wait for the deliveries in flight on the
// partitions they concern, and never longer than their context: none of
// them blocks forever. A Stream delivery that nobody has received yet is
// taken back at once, without counting an attempt; one a caller holds is
// waited for. When the context ends first, Pause has paused and Leave has
// left (the partitions move when their deliveries end), while Seek and
// Replay have moved nothing. Subscribe never waits: a partition that moves
// to a new consumer finishes its delivery in flight first.
//
// # Ordering
//
//   - Within a partition, records get consecutive offsets from 0, and each
//     group's handler sees them in offset order, one at a time. Nothing is
//     ordered across partitions.
//   - Records whose encoded keys are equal land in the same partition for
//     the topic's life (CRC-32 of the key bytes, the same in every process),
//     so they reach each group in the order they were published. Keyless
//     records are spread round robin and have no order across partitions.
//   - A record being retried holds back the records behind it in its
//     partition: retries never reorder a partition.
//   - A group with [pubsub.WithKeyConcurrency] runs several records of a
//     partition at once, never two with equal keys: per-key order holds,
//     order across keys inside a partition does not, and a retry holds
//     back only its key. Its doc says what else changes.
//
// # Delivery
//
// Delivery is at least once. A group commits a record's offset only after
// its handler returned nil, or after the record went to the dead-letter
// queue. A record is delivered to a group again when
//
//   - its handler failed or panicked (a retry, with Message.Attempt counting
//     up);
//   - the group was paused, or its partition moved to another consumer,
//     while the record waited out a retry backoff (the next delivery
//     continues the attempt count);
//   - Close gave up on draining while the handler ran (nothing a handler
//     does after Close returned is committed; nothing is persisted either);
//   - the group sought or replayed back over it (Attempt starts at 1 again).
//
// A rebalance alone never causes a redelivery: a partition that moves
// finishes its current delivery, and commits it, before its new owner
// starts; partitions that do not move are not disturbed. Handlers should be
// idempotent all the same; Message.ID identifies a record across
// redeliveries.
//
// # Retries and dead letters
//
// A failed delivery is retried after BaseDelay, then BaseDelay·Multiplier,
// and so on up to MaxDelay, until MaxAttempts deliveries were made
// ([pubsub.RetryPolicy]). Then the record goes to the group's bounded
// dead-letter queue, with the attempts, the last error and the time, and
// the partition moves on: one poison record cannot stall it. An error that
// wraps [pubsub.ErrPermanent] skips the retries; so does a value the codec
// cannot decode, which never reaches the handler. A panic in a handler is
// recovered and counts as a failed attempt ([pubsub.PanicError]).
//
// # Bounded buffers and backpressure
//
// Each partition holds at most Retention.MaxMessages records. Records are
// not freed when acked, so a group can replay them; they are freed when the
// partition is full and every group has committed past them, or when they
// are older than Retention.MaxAge. When a partition is full and nothing can
// be freed:
//
//   - Block makes Publish wait for room, at most BlockTimeout and never past
//     its context, then fail with [pubsub.ErrBackpressure], having appended
//     nothing. The slowest group sets the pace of the producers; a group
//     nobody consumes any more holds them up until it is deleted
//     ([pubsub.Broker.DeleteGroup]).
//   - DropOldest evicts the oldest record, read or not, and Publish never
//     waits. A group that had not begun delivering an evicted record skips
//     it.
//
// Block waits only for groups: a full partition that no group reads trims
// its oldest record instead (counted as Dropped), so an event bus nobody
// listens to yet never fails its producers, and a group that subscribes
// later finds the newest records. An ErrBackpressure error names the group
// that holds the oldest record, the one setting the pace.
//
// Nothing is lost silently: TopicStats counts what was reclaimed, dropped
// and expired, and each group counts what it skipped in GroupStats.Skipped.
// A group created after records were freed starts at the oldest record
// still retained.
//
// # Time
//
// A record's Message.Created comes from the broker's Clock. The default
// reads time.Now once per millisecond while records are published, not once
// per record (on some machines a clock read costs as much as the rest of a
// publish): Created is never later than the publish and at most about a
// millisecond earlier, the precision of a Kafka timestamp. A goroutine
// refreshes that reading only while it is used, so an idle broker runs no
// timer. MaxAge measures age against time.Now itself. [pubsub.WithClock]
// injects any other clock: one that calls time.Now for exact stamps, or
// pubsubtest.Clock for tests that move time by hand. Waits (retry backoff,
// BlockTimeout) use the runtime's timers, which testing/synctest makes
// virtual.
//
// # Shutdown
//
// [pubsub.Broker.Close] refuses new work with [pubsub.ErrClosed], fails
// producers blocked on a full partition, waits (bounded by its context) for
// every group that can make progress to commit everything, stops every
// goroutine and waits for it. It returns by the time its context ends, plus
// a 10ms grace: when the context ends it cancels the context handlers were
// given, and a handler that ignores it is left to finish in the background,
// committing nothing. Whatever was left, Close returns a
// [pubsub.ShutdownError] naming each partition with its committed and end
// offsets, and whether its handler was still running.
//
// [pubsub.Broker.Drain] is the same barrier without the stop; tests wait on
// it instead of sleeping. It never returns nil while a group has lag: a
// group that cannot move (paused, or without consumers) makes it return at
// once an error wrapping [pubsub.ErrStalled] that names the group.
//
// # Errors
//
// Every error a pubsub call returns wraps one of pubsub's sentinel errors
// or a context's error, so errors.Is classifies it; the message starts with
// "logbus: " and the call's own verb. ShutdownError, PanicError and
// DecodeError carry details for errors.AsType; a batch handler returns a
// BatchError to name the message that failed.
//
// # Engines
//
// The typed API sits on an engine that stores the log and delivers it. The
// default, [pubsub.InMemory], keeps every promise above exactly. Another
// engine is chosen with [pubsub.WithEngine], and the code that publishes and
// handles stays the same: codecs, routing (a key lands on the same partition
// whatever the engine), Message, Stream and the errors are the typed
// layer's. Some promises only some engines can keep (an injected clock,
// custom IDs, Block that waits for the slowest group's commit, records
// freed on commit, a give-back that counts no attempt); an engine declares
// which it keeps, and asking one for an option it cannot honour is
// ErrInvalid, never silently different behaviour. The conformance suite in
// pubsubtest checks an engine against the rest.
//
// The module github.com/logbus/logbus/jetstream is such an engine, on NATS
// JetStream: a group's partitions spread over processes, and records,
// offsets and dead letters survive restarts. Its package documentation
// says which promises it keeps exactly and which approximately.
//
// # Observing a broker
//
// [pubsub.Broker.Snapshot] copies the state of every topic and group:
// partitions with their bounds and counters, and per group its consumers,
// assignment, committed offsets, lag in records and in time (the age of
// the oldest record not yet committed), the delivery in flight with its
// attempt, and its dead-letter count. It is how a program lists a broker's
// topics and groups, and what metrics and a debug page read, at no cost to
// the hot path. An engine that cannot describe itself gives a Partial
// snapshot.
//
// [pubsub.WithHooks] registers values implementing any of the Hook*
// interfaces (publish, delivery start and end, retry, dead letter,
// rebalance, backpressure, drop, expiry, skip, stuck handler, close): the
// broker sorts them once, and an event nobody hooks costs a nil check.
// Hooks run outside every lock, on the goroutine where the event
// happened; a panicking hook is recovered and logged. [pubsub.WithLogger]
// logs to a log/slog logger, silent by default, never above Debug per
// record, with the OpenTelemetry messaging attribute keys.
// [pubsub.WithStuckAfter] reports handlers that run too long by sampling
// what the workers already record: no clock read per delivery, and no
// goroutine without it. [pubsub.Group.Redrive] sends chosen dead letters
// back to the group that failed them, and to no other;
// [pubsub.Group.DiscardDeadLetters] drops them, and
// [pubsub.Group.LatestDeadLetters] reads the newest few.
// [pubsub.Broker.Ping] answers a health check.
//
// # What is not promised
//
//   - Durability, with the default engine: the log lives in memory and is
//     gone with the process.
//   - Anything across processes, with the default engine: one broker
//     serves one process.
//   - Exactly-once: at-least-once plus an idempotent handler is the way.
//   - Order across partitions, or across topics.
//   - Timestamps finer than the default clock's millisecond (see Time).
//
// # Sizing
//
// Memory is bounded by retention: each partition holds at most
// Retention.MaxMessages records and, with Retention.MaxBytes, at most that
// many bytes of keys, values and headers. [pubsub.Retention] gives what a partition
// and a record cost, measured, and [pubsub.MaxPartitions] and
// [pubsub.MaxTopicMessages] bound a topic's shape, so that a typo is an
// error rather than an out-of-memory crash. The Bytes, RawBytes, String and
// Int codecs encode a new record into the buffers of one every group has
// committed past, so publishing allocates nothing for its bytes. A delivery
// allocates the value it decodes (with Bytes, a copy of the bytes);
// RawBytes saves that allocation by handing the handler the log's own
// bytes, valid until it returns.
//
// Each group runs one parked goroutine per partition (a few KiB of stack
// each) and costs no CPU while idle: workers wait on channels, never on
// timers.
//
// # When to pick logbus over a channel
//
// A channel is the right tool between two goroutines that live and die
// together. Pick logbus when producers and consumers are decoupled: when
// several independent consumers each need every event, when a slow or
// failing consumer must not lose events or block the others silently, when
// events must be retried, parked or replayed, when per-key order must hold
// while work spreads over goroutines, or when shutdown must drain what was
// published. On the way it does what channels do not: it shares one copy of
// each record between all groups, and a worker takes every record appended
// since it last looked in one step.
package logbus
