// Package logbus is a typed, in-process publish/subscribe message queue with
// the semantics of a Kafka log: partitioned topics, consumer groups with
// committed offsets, at-least-once delivery with retries and dead letters,
// bounded buffers with explicit backpressure, replay, and a graceful
// shutdown that drains before it stops.
//
// This package holds only documentation: the overview, and the guarantees
// that hold across the API. The API is in package
// [github.com/logbus/logbus/pubsub], the codecs that turn values into bytes
// in [github.com/logbus/logbus/codec], and test helpers in
// [github.com/logbus/logbus/pubsub/pubsubtest]. A rule about one call,
// option or type is stated in its own documentation, linked from here.
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
// Producers publish; [pubsub.Topic.Publish] returns once the record is in
// the log, with its partition and offset:
//
//	pos, err := orders.Publish(ctx, order.Customer, order)
//
// Many records at once go through [pubsub.Topic.PublishBatch] (or
// PublishValues for keyless ones), at a lower cost per record.
// [pubsub.Topic.PublishAsync] does not wait for the engine's confirmation:
// it returns a [pubsub.Pending], and [pubsub.Topic.Flush] waits for the
// records issued before it and says how many failed. What a partition
// stores of them is a prefix of what was issued, in call order. On a
// remote engine (JetStream) many records are then in flight at once:
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
// ([pubsub.Topic.Stream]), or in batches ([pubsub.Topic.SubscribeBatch]),
// committed once per batch. A group can pause, resume, seek and replay, and
// it reports its lag, its counters and its dead letters ([pubsub.Group]). A
// handler that needs the typed key asks the topic: orders.Key(msg).
//
// # Where a group starts, and moving it
//
// A new group starts at the oldest retained record, or where
// [pubsub.StartAt] says: [pubsub.Earliest], [pubsub.Latest] (only what is
// published from now on), [pubsub.AtOffset] or [pubsub.AtTime]. No record
// before the start is ever delivered to it. A group's options are fixed by
// the call that created it ([pubsub.SubscribeOption]): two replicas cannot
// disagree silently.
//
// [pubsub.Group.Pause], Seek, Replay (which takes the same Start values, so
// a group can replay by time) and Leave wait for the deliveries in flight
// on the partitions they concern, and never longer than their context:
// none of them blocks forever, and each says what it has done when the
// context ends first. Subscribe never waits: a partition that moves to a
// new consumer finishes its delivery in flight first.
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
//   - its handler failed or panicked (a retry, with [pubsub.Message.Attempt]
//     counting up);
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
// idempotent all the same; [pubsub.Message.ID] identifies a record across
// redeliveries. [pubsub.Handler] says what a handler may and must not do.
//
// # Retries and dead letters
//
// A failed delivery is retried with exponential backoff, and a record that
// keeps failing goes to the group's bounded dead-letter queue, with its
// attempts, its last error and the time ([pubsub.RetryPolicy],
// [pubsub.DeadLetter]); the partition moves on, so one poison record cannot
// stall it. An error that wraps [pubsub.ErrPermanent] skips the retries, as
// does a value the codec cannot decode ([pubsub.DecodeError]), which never
// reaches the handler. A panic in a handler is recovered and counts as a
// failed attempt ([pubsub.PanicError]). [pubsub.Group.Redrive] sends dead
// letters back to the group that failed them, and to no other.
//
// # Bounded buffers and backpressure
//
// Each partition holds at most Retention.MaxMessages records (and, with
// MaxBytes, bytes). Records are not freed when acked, so a group can
// replay them; they are freed when the partition is full and every group
// has committed past them, or when they expire ([pubsub.Retention]). When
// a partition is full and nothing can be freed, [pubsub.Block] makes the
// producer wait for room, bounded, then fail with [pubsub.ErrBackpressure]
// naming the group that sets the pace, and [pubsub.DropOldest] evicts the
// oldest record instead. A group nobody consumes any more holds the
// producers of a Block partition up until it is deleted
// ([pubsub.Broker.DeleteGroup]), while a partition that no group reads
// trims instead of blocking ([pubsub.Retention]), so an event bus nobody
// listens to yet never fails its producers.
//
// Nothing is lost silently: [pubsub.TopicStats] counts what was reclaimed,
// dropped and expired, and each group counts what it skipped
// ([pubsub.GroupStats.Skipped]).
//
// # Time
//
// A record's [pubsub.Message.Created] comes from the broker's clock: by
// default time.Now read once per millisecond while records are published,
// so Created is at most about a millisecond early, the precision of a Kafka
// timestamp ([pubsub.WithClock] says exactly, and injects any other clock,
// such as pubsubtest's for tests that move time by hand). Waits (retry
// backoff, BlockTimeout) use the runtime's timers, which testing/synctest
// makes virtual.
//
// # Shutdown
//
// [pubsub.Broker.Close] refuses new work with [pubsub.ErrClosed], drains
// what every group can still deliver, bounded by its context (plus a 10ms
// grace for handlers to return), stops every goroutine and waits for it.
// Whatever it left, it names in a [pubsub.ShutdownError]: nothing acked is
// ever lost. [pubsub.Broker.Drain] is the same barrier without the stop;
// tests wait on it instead of sleeping, and a group that cannot move makes
// it fail at once with [pubsub.ErrStalled] rather than hang.
//
// # Errors
//
// Every error a pubsub call returns wraps one of pubsub's sentinel errors
// ([pubsub.ErrClosed] and the others) or a context's error, so errors.Is
// classifies it; the message starts with "logbus: " and the call's own
// verb. [pubsub.ShutdownError], [pubsub.PanicError] and
// [pubsub.DecodeError] carry details for errors.AsType; a batch handler
// returns a [pubsub.BatchError] to name the message that failed.
//
// # Engines
//
// The typed API sits on an engine that stores the log and delivers it. The
// default, [pubsub.InMemory], keeps every promise above exactly. Another
// engine is chosen with [pubsub.WithEngine], and the code that publishes and
// handles stays the same: codecs, routing (a key lands on the same partition
// whatever the engine), Message, Stream and the errors are the API's. Some
// promises only some engines can keep (an injected clock, custom IDs, Block
// that waits for the slowest group's commit, records freed on commit, a
// Stream's give-back that counts no attempt); an engine declares which it
// keeps ([pubsub.Broker.Capabilities]), and asking one for an option it
// cannot honour is an error, never silently different behaviour. The
// conformance suite in [github.com/logbus/logbus/pubsub/pubsubtest/conformance]
// checks an engine against the rest.
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
// assignment, committed offsets, lag in records and in time, the delivery in
// flight with its attempt, and its dead-letter count. It is how a program
// lists a broker's topics and groups, and what metrics and a debug page
// read, at no cost to the hot path.
//
// [pubsub.WithHooks] registers values implementing any of the Hook*
// interfaces (publish, delivery start and end, retry, dead letter,
// rebalance, backpressure, drop, expiry, skip, stuck handler, close):
// an event nobody hooks costs a nil check, and [pubsub.Hook] says where
// hooks run and what they may call. [pubsub.WithLogger] logs to a log/slog
// logger, silent by default, never above Debug per record, with the
// OpenTelemetry messaging attribute keys. [pubsub.WithStuckAfter] reports
// handlers that run too long, at no cost per delivery.
// [pubsub.Group.LatestDeadLetters] reads the newest dead letters,
// [pubsub.Group.DiscardDeadLetters] drops them, and [pubsub.Broker.Ping]
// answers a health check. Package [github.com/logbus/logbus/debughttp]
// serves a debug page, and the module github.com/logbus/logbus/otellogbus
// traces and measures a broker with OpenTelemetry.
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
// many bytes of keys, values and headers. [pubsub.Retention] gives what a
// partition and a record cost, measured, and [pubsub.MaxPartitions] and
// [pubsub.MaxTopicMessages] bound a topic's shape, so that a typo is an
// error rather than an out-of-memory crash. With the codecs that can
// append ([codec.Appender]) publishing allocates nothing for a record's
// bytes. A delivery allocates the value it decodes (with Bytes, a copy of
// the bytes); [codec.RawBytes] saves that allocation by handing the
// handler the log's own bytes, valid until it returns.
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
