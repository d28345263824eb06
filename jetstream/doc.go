// Package jetstream is a logbus engine on NATS JetStream: the typed API of
// package [github.com/logbus/logbus/pubsub] (topics, groups, handlers,
// Streams) across processes, with records, offsets and dead letters that
// survive restarts.
//
// # Concepts
//
//   - An engine ([engine.Driver], from [Connect], [New] or
//     [Server.Engine]) is given to pubsub.NewBroker with
//     pubsub.WithEngine. Every promise of package pubsub holds, exactly or
//     approximately as the sections below say; what needs a promise this
//     engine does not keep is refused with pubsub.ErrInvalid. The errors
//     named below are package pubsub's.
//   - A topic is one JetStream stream per partition, and a group one
//     durable JetStream consumer per partition. Here "JetStream stream"
//     always means the server's; a Stream is logbus's channel consumer
//     (pubsub.Stream).
//   - Brokers that use the same prefix ([WithPrefix]) on one server or
//     cluster share their topics and groups: the members of a group may be
//     in many processes, and each partition is delivered by one of them at
//     a time. Membership and the assignment of partitions are kept on the
//     server, in two KV buckets.
//   - Time is the server's: it stamps records and measures their age.
//     Failures are seen in seconds (heartbeats, redelivery timeouts), not
//     microseconds.
//
// # Constructing an engine
//
// From a connection the application already has:
//
//	nc, _ := nats.Connect(url)
//	eng, err := jetstream.Connect(nc) // or jetstream.New(js) from a JetStream context
//	b := pubsub.NewBroker(pubsub.WithEngine(eng))
//
// Or, for one process that wants durability without running a server, an
// embedded server that stores its data in a directory the caller names
// and listens on a random port of 127.0.0.1 ([StartServer]):
//
//	srv, err := jetstream.StartServer(dir)
//	defer srv.Shutdown()
//	b := pubsub.NewBroker(pubsub.WithEngine(srv.Engine()))
//
// A broker's Close closes a connection [Server.Engine] opened for it, never
// one the caller passed. On a cluster, WithReplicas(3) keeps everything the
// engine creates on three servers (see Replicas below). Give the
// connection every server's URL, so that it moves to another when its
// server goes away:
//
//	nc, _ := nats.Connect("nats://a:4222,nats://b:4222,nats://c:4222", nats.MaxReconnects(-1))
//	eng, err := jetstream.Connect(nc, jetstream.WithReplicas(3))
//
// # Names
//
// Offsets are dense from 0 (offset = JetStream stream sequence − 1). Topic,
// group and consumer names may be any string: they are encoded into server
// names, never refused for their characters. ASCII letters, digits and '-'
// stand for themselves; every other byte, '_' included, becomes '_' and
// two hex digits, so distinct names never meet on the server. With prefix
// P, topic t and group g, partition i is JetStream stream P_T_<t>_P<i> on
// subject P.<t>.<i>, the group's consumer on it is <g>_P<i>, its dead
// letters are JetStream stream P_D_<t>_G_<g> (redriven ones wait in
// P_R_<t>_G_<g>, read by consumer P<i>), and membership is the KV buckets
// P_members and P_members_deals. Only a name too long for the server (over
// 200 bytes encoded) is refused, with ErrInvalid. A topic created again
// with the same configuration (by another broker, or after a restart)
// attaches to its JetStream streams; with another partition count or
// retention it is ErrTopicExists.
//
// A group's options (retries, dead-letter limit, start) are stored with
// its consumers, in a versioned form of this engine's own, so that a
// broker joining the group with other options gets ErrSubscription.
// Groups made by earlier versions of logbus are read in the form those
// wrote; a broker of an earlier version cannot join a group this version
// made (ErrSubscription), so upgrade a group's brokers before they make
// new groups.
//
// # Ordering and delivery
//
// Routing a key to a partition is package pubsub's, so it is the same as in
// memory. Per-key order and one delivery at a time per partition are exact
// (for key concurrency, see below): the server lets a partition's
// consumer hold one unacknowledged record at a time, so a retry holds back
// the records behind it, also across failover. Every group sees every
// record. Retries, their backoff and MaxAttempts are exact; the server
// counts the attempts, so they survive failover, and redelivers a failed
// record after its backoff. Seek, Replay
// and StartAt (an offset or a time, by the server's clock) are exact, by
// resetting the consumer.
//
// A handler's nil is an acknowledgement to the server. While records flow
// it carries the pull for the next record and waits for no reply (the
// server sends the next record once it read the acknowledgement); it is
// confirmed by the server when the partition runs dry, is held or moves.
// An acknowledgement that fails on the client may still have committed,
// and one lost with the connection brings the record again after AckWait
// ([WithAckWait]), Attempt+1: handlers must be idempotent.
//
// A batch consumer (pubsub's Topic.SubscribeBatch) pulls up to its batch
// size at a time: the server lets the consumer hold that many
// unacknowledged records while a batch consumer serves the partition, and
// one again under a per-record consumer. The batch is acknowledged in order
// after the handler, the last acknowledgement confirmed. A failed record is
// retried alone while the ones after it wait unacknowledged, kept alive,
// counting no attempt, unless the partition moves meanwhile (then they
// come again with Attempt+1, after it). Records pulled but not yet handed
// over when the partition moves are delivered by the stopping worker when
// it goes to another broker (or at Close), and otherwise given back
// unsettled, with the same Attempt. WithBatchWait tops a batch up by
// further pulls.
//
// Key concurrency (pubsub.WithKeyConcurrency with n above 1) is exact except
// after a crash. The server lets the partition's consumer hold as many
// unacknowledged records as the group's window (max(64, 16n) records, the
// bound pubsub.WithKeyConcurrency states; not n, since a record waiting
// behind its key, or out its backoff, is unacknowledged too, and n of
// them would stall every other key). The worker reads no further than
// the window allows, runs up to n records of distinct keys at once and
// acknowledges each on its own, so the server's committed offset stops
// at the oldest unsettled record. A retry waits out its backoff in the
// process that delivered it, kept alive on the server, holding only its
// key; the server does not count those retries, so after the partition
// moves to another broker an Attempt number may come again. A clean
// hand-over (a rebalance, Leave, Close) lets the deliveries in flight
// end, and nothing that settled comes again. A member of the same broker
// goes on with the records read and not settled as they stand; for one of
// another broker (or at Close) they are given back, in stream order, and
// the next owner delivers them first, in that order, with Attempt+1 (also
// a record never handed to a handler). After a crash, the records the
// process had not settled come again after AckWait, possibly after later
// records of their key: there per-key order holds only up to the crash.
//
// A partition's worker acts on Pause, Seek, Replay, a rebalance and Close
// between pulls, so on an idle partition they wait up to the poll wait
// ([WithPollWait], 250ms by default). Pause and Resume are the server's
// pause of the group's consumers (its redrive consumers too), so they act
// across processes: a broker that paused follows another's Resume within
// MemberTTL/3.
//
// # Groups across brokers
//
// A group's partitions are dealt out over its live members as in memory,
// moving as few as balance allows, and the deal is stored on the server so
// that every broker follows the same one. The server itself lets only the
// owner of a partition pull from its consumer, so two brokers never deliver
// one partition at once. A consumer name is one member across brokers:
// joining with a name another broker holds is ErrSubscription, and so is a
// name whose broker crashed, until its key expires ([WithMemberTTL]).
// Heartbeats run on their own, so a slow request of the broker's never lets
// its keys expire.
//
// A clean join or leave redelivers nothing: a record a stopping worker had
// pulled but not delivered goes to the next owner in this broker, or back to
// the server as never delivered, so the next owner in any broker delivers
// it within its poll wait, with Attempt 1 (a record being retried is handed
// back as failed instead, and comes with Attempt+1). A Stream's delivery
// given back unread keeps its Attempt, within a broker and across, unless
// Close gave up first. After a member crashes, the one record it had in
// flight comes again after AckWait, Attempt+1.
//
// The membership buckets are on file; a broker makes them again if the
// server lost them (a deletion; memory buckets of older versions across a
// restart), and its watches follow. While it cannot read them it keeps the
// deal it had, logs a warning and shows the error in the snapshot
// (pubsub's GroupSnapshot.MembershipErr). DeleteGroup and DeleteTopic act
// on the server; other brokers stop their members once they see the deal
// deleted or a pull finds no consumer.
//
// # Publishing
//
// Records are stamped by the server's clock (Message.Created, and MaxAge
// by it): WithClock is refused with ErrInvalid. A record's Message.ID is
// "<JetStream stream>-<sequence>": WithIDs is refused too. Keys and headers
// are kept as exact bytes, invalid UTF-8 included, in one binary header: at
// most [MaxKeyAndHeadersSize] together, and the whole record within the
// server's max_payload (1 MiB by default), else ErrInvalid at publish.
//
// A failed Publish stored nothing, unless its error wraps
// [ErrOutcomeUnknown] (sent, never answered). Within its ctx the engine
// waits out an outage and sends again under the record's message ID, so it
// is stored once. The server holds each ID for its duplicate window (2
// minutes): about 100 bytes of its memory per record published in that time
// (measured), and the ID's header is stored with the record.
//
// PublishAsync keeps many records in flight per partition on the broker's
// connection (WithMaxInFlight per topic), stored in call order. A failure
// is recovered by asking the server about each record in doubt (under its
// message ID) and sending the first one not stored again, never after a
// later one, so nothing is stored twice or reordered. Unlike in memory, a
// record the server refuses while it stores a later one (MaxBytes, room
// made between them) leaves a gap, reported record by record. Every Pending
// resolves within three request timeouts ([WithRequestTimeout]) of being
// sent, plus BlockTimeout under Block.
//
// # Retention and backpressure
//
// A partition's retention is its JetStream stream's limits. Under
// DropOldest the server evicts the oldest record; Dropped counts evictions
// while MaxAge is 0. MaxBytes is the server's byte limit, which counts a
// record's headers and subject too, so a partition holds a little less
// than in memory.
//
// Under Block the server refuses a record once the partition is full. A
// full partition first purges its oldest record if every group committed
// it; if not, the publisher tries again, 1–20ms apart, until BlockTimeout,
// then fails with ErrBackpressure naming the slowest group. A partition no
// group reads drops its oldest record instead, as in memory. This is
// approximate: it is read from the groups' committed offsets on the
// server, polled, so a blocked publisher gets room within a poll of the
// slowest group's commit, not at once.
//
// # Dead letters and redrive
//
// A group's dead letters are a JetStream stream of their own, so they
// survive restarts (WithDeadLetterLimit(0) stores none, as in memory).
// They are read newest first, in batches: a read cut short keeps the
// newest, and LatestDeadLetters says so with an error. Errors read back
// match the same sentinels, with their text only.
//
// A letter too big for the server is stored smaller: its error text cut to
// [MaxErrorText], then without the record's value (DeadLetter.Truncated;
// Redrive refuses it). One the server refuses even so is tried MaxAttempts
// times, the handler not run again, then dropped: counted in DeadLettered
// and DeadLettersEvicted, reported (OnDeadLetter with Evicted, and
// logged), and the partition moves on. One the server cannot be asked to
// store is tried until it can (the snapshot shows Retrying).
//
// Group.Redrive copies letters to a redrive JetStream stream of the group
// (a work queue, with a subject and a consumer per partition that only the
// partition's owner reads): a letter leaves the dead letters once its copy
// is stored there, and the partition's owner, in whichever broker, delivers
// it before its next pull (an idle worker within a poll wait), with
// attempts from 1 counted by the server. It survives restarts and failover
// (a member that dies holding one: the next owner delivers it after
// AckWait, Attempt+1). Close leaves what is queued on the server, delivered
// when the group next runs, instead of putting it back in DeadLetters.
// GroupStats.Redriven counts this broker's Redrive calls.
//
// # Failures and durability
//
// The server's acknowledgement of a publish (its PubAck) means the record
// reached the operating system on the partition's server (R1) or on most
// of its replicas (R3: two of three), so a crashed server process loses
// nothing acknowledged (measured). The disk is synced every two minutes,
// so a power loss may lose up to that, unless the server syncs every write
// (StartServer's [WithSyncAlways], or the server's sync_interval: always),
// at a cost.
//
// After a server crash (R1, or all of a partition's replicas), records
// committed in about the last 100ms before the crash come again, with
// Attempt 1 and from the same member, offsets going back: the server
// writes a consumer's state to disk at most about ten times a second
// (measured over nine SIGKILLs: 10-291 records over four partitions,
// committed up to 107ms before). Handlers must deduplicate on Message.ID,
// which is the same every time a record comes. When one server of R3 or R5
// is lost nothing acknowledged is lost, and what it led stalls until the
// others elect new leaders (see Replicas).
//
// A call that needs the server returns an error wrapping ErrUnavailable
// when it cannot reach it (connection lost, no responders, no quorum, a
// request timeout); Ping asks the server. Lag, Committed and Stats are read
// from each partition's last sequence and the group's committed offset on
// the server; while the server cannot be asked they are what was last
// read, never 0 or -1 (the snapshot says Unavailable, and when each value
// was Observed). Close works with the server down too: what was left is
// then as last observed, and its error wraps ErrUnavailable. Its
// ShutdownError names the partitions of this broker's groups that no other
// broker carries on, which drain only what this broker owns; reads after
// Close answer from what Close saw last. Drain waits for the groups this
// broker joined (their redriven letters too), polling the server every
// 20ms (local commits wake it at once).
//
// # What a broker observes
//
// Each broker observes its own deliveries and publishes. The counters
// Reclaimed, Dropped (with MaxAge), Blocked, TimedOut, Delivered, Retried,
// DeadLettered and Skipped count what this process saw; Expired is not
// counted. The snapshot reads topics, partitions, committed offsets, lag
// and Oldest from the server (Oldest by its clock, Taken by this
// process's), owners and consumers from the deal, and Redriving from the
// server; InFlight, Retrying and Attempt, and so RunningFor, only for this
// broker's own deliveries. It lists the groups this broker created, joined
// or named. WithStuckAfter watches this process's deliveries only, sampled
// as in memory; a handler running in another broker is that broker's to
// report.
//
// The engine's events reach the hooks and the logger as this process sees
// them: retries and dead letters of its own deliveries (a dead letter's
// Evicted from what this process stored); a rebalance whenever the
// assignment this broker follows changes (before and after as this broker
// saw the deal, so a change made while it was not looking is one event);
// backpressure waits and timeouts of its own publishes; drops by the purge
// of a full partition no group reads, and by eviction on a DropOldest
// partition bounded by count alone (told from the sequence each publish
// stored: evictions under MaxAge or MaxBytes, and those before the broker
// attached, are not reported); skips its workers find; stuck handlers of
// its own deliveries. Expiries are not reported (the server trims by age
// unseen).
//
// pubsub's Broker.Capabilities says which of the optional promises this
// engine keeps. It does not keep these: an injected clock and custom IDs
// (the server stamps and names records), a Block that waits exactly for
// the slowest group's commit (it polls), virtual time (the nats.go client
// cannot run in a testing/synctest bubble), and asynchronous publishes
// stored without a gap (see Publishing).
//
// # Performance
//
// One record in flight per partition is what keeps order. The
// acknowledgement of a record carries the pull for the next and waits for
// no reply, so a record costs one message each way, as with the raw
// nats.go client's Consume and asynchronous acknowledgements. Measured
// against an embedded server on a shared 2-core machine (bench/README.md
// has the numbers and the commands): consuming a backlog, about 0.8 of the
// raw client doing the same work (some 44 thousand records a second over
// four partitions); publishing and consuming at once, 0.5 to 0.8 of it,
// bounded by the publisher; a batch consumer 2.5 to 3 times a per-record
// one where batches form (a partition fed by short runs needs
// WithBatchWait for that).
//
// # Replicas
//
// [WithReplicas] sets how many servers of a cluster keep each JetStream
// stream, consumer and KV bucket the engine creates. What each count
// survives and costs, measured on a cluster of three servers on one
// machine's loopback (2 shared cores; bench/README.md has the commands):
//
//   - R1, the default: each partition, consumer and bucket lives on one
//     server. When that server is lost, what lives there stops until it
//     comes back: publishes to its partitions fail, their groups get
//     nothing, and if it holds the membership buckets no broker can open
//     and no group can follow its membership. Nothing acknowledged is
//     lost once it is back on its store. The server places R1 JetStream
//     streams by free storage, which on the cluster measured put every
//     partition of every topic on one server; the engine cannot move them.
//   - R3: each lives on three servers, and an acknowledgement means two
//     of them have it. When one server is lost nothing acknowledged is
//     lost, and what it led stalls until the other two elect new leaders,
//     4-9s after the loss (the server's Raft election timeout): meanwhile
//     publishes to those partitions fail (time out) and their deliveries
//     wait. Measured over seven SIGKILLs of a server leading two of six
//     partitions, under a producer and a group of two: every partition
//     took publishes again within 5.0-7.5s of the kill and handled a new
//     record within 6.3-8.2s, every JetStream stream, consumer and bucket
//     had a leader within 6.5-8.5s, and a broker opened then joined the
//     group in 30-170ms; no acknowledged record was lost, no member
//     dropped out (MemberTTL 5s), and no record came again with the same
//     Attempt (the few whose acknowledgements went with the dead server's
//     connections came after AckWait, Attempt+1). Opening a broker,
//     creating a topic or subscribing while an election is pending may
//     fail (the server's JetStream is "temporarily unavailable", or a
//     request times out): try again. When two of the three are lost, what
//     they kept stops as with R1. It costs: publishing about half as fast
//     (one Publish at a time 2.7k records a second against 4.9k for R1;
//     PublishBatch of 64, 22k against 42k), three times the storage, and
//     more time to create a topic and a group (about 0.6s and 1.5s for six
//     partitions).
//   - R5: five servers, two of which may be lost; an acknowledgement
//     waits for three. Not measured here; it costs more than R3 in the
//     same ways.
//
// The server picks the leader of a replicated JetStream stream or consumer
// at random among its replicas, which often put four of six partitions on
// one server of three. The engine spreads the leaders of a new topic's
// partitions, and of a new group's consumers, evenly over the servers (by
// asking the server to move a leader), so that a topic's publishes and
// pulls share the cluster and a lost server stalls a third of them.
//
// # Who may publish
//
// Permission to publish on a topic's subjects is enough to send its
// consumers any bytes, bypassing the typed API's encoder. Decode such
// topics with a codec whose work is bounded by the record (codec.JSON,
// codec.String, codec.Bytes): with codec.Gob one forged record of about
// 127 bytes can allocate hundreds of MiB, or keep a CPU busy for hours,
// in every consumer. Restrict publish permissions with the server's
// accounts and users where publishers are not all trusted.
package jetstream
