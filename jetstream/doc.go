// Package jetstream is a logbus engine on NATS JetStream: the typed API of
// package pubsub (topics, groups, handlers, streams) across processes,
// with records, offsets and dead letters that survive restarts.
//
// # Constructing an engine
//
// An engine is given to pubsub.NewBroker with pubsub.WithEngine. From a
// connection the application already has:
//
//	nc, _ := nats.Connect(url)
//	eng, err := jetstream.Connect(nc) // or jetstream.New(js) from a JetStream context
//	b := pubsub.NewBroker(pubsub.WithEngine(eng))
//
// Or, for one process that wants durability without running a server, an
// embedded server that stores its data in a directory the caller names
// and listens on a random port of 127.0.0.1:
//
//	srv, err := jetstream.StartServer(dir)
//	defer srv.Shutdown()
//	b := pubsub.NewBroker(pubsub.WithEngine(srv.Engine()))
//
// Brokers that use the same prefix (WithPrefix) on one server share their
// topics and groups: two processes subscribing to the same group share
// its partitions. A broker's Close closes a connection Server.Engine
// opened for it, never one the caller passed.
//
// On a cluster, WithReplicas(3) keeps everything the engine creates on
// three servers (see Replicas below). Give the connection every server's
// URL, so that it moves to another when its server goes away:
//
//	nc, _ := nats.Connect("nats://a:4222,nats://b:4222,nats://c:4222", nats.MaxReconnects(-1))
//	eng, err := jetstream.Connect(nc, jetstream.WithReplicas(3))
//
// # Names
//
// A topic is one stream per partition, so offsets are dense from 0 (offset
// = stream sequence − 1); a group is one durable consumer per partition.
// Topic, group and consumer names may be any string: they are encoded into
// server names, never refused for their characters. ASCII letters, digits
// and '-' stand for themselves; every other byte, '_' included, becomes
// '_' and two hex digits, so distinct names never meet on the server. With
// prefix P, topic t and group g, partition i is stream P_T_<t>_P<i> on
// subject P.<t>.<i>, the group's consumer on it is <g>_P<i>, its dead
// letters are stream P_D_<t>_G_<g> (redriven ones wait in P_R_<t>_G_<g>,
// read by consumer P<i>), and membership is the KV buckets
// P_members and P_members_deals. Only a name too long for the server
// (over 200 bytes encoded) is refused, with ErrInvalid. A topic created again with the
// same configuration (by another broker, or after a restart) attaches to
// its streams; with another partition count or retention it is
// ErrTopicExists.
//
// A group's options (retries, dead-letter limit, start) are stored with
// its consumers, in a versioned form of this engine's own, so that a
// broker joining the group with other options gets ErrSubscription.
// Groups made by earlier versions of logbus are read in the form those
// wrote; a broker of an earlier version cannot join a group this version
// made (ErrSubscription), so upgrade a group's brokers before they make
// new groups.
//
// # What maps exactly, what approximately
//
//	logbus promise                        here
//	------------------------------------  -----------------------------------------------
//	offsets dense from 0, per partition   exact (stream per partition)
//	key → partition (CRC-32)              exact: routing is the typed layer's
//	per-key order, one delivery at a      exact: MaxAckPending 1, so a retry holds back the
//	  time per partition                    records behind it, also across failover
//	batch consumers (SubscribeBatch)      a pull of up to the batch size (MaxAckPending is the
//	                                        batch size while a batch consumer serves the
//	                                        partition, one again under a per-record one); acked
//	                                        in order after the handler, the last ack confirmed;
//	                                        a failed record is retried alone (NakWithDelay) while
//	                                        the ones after it wait unacked, kept alive, counting
//	                                        no attempt, unless the partition moves meanwhile
//	                                        (then they come again with Attempt+1, after it).
//	                                        Records fetched but not yet handed over when the
//	                                        partition moves are delivered by the stopping
//	                                        worker when it goes to another broker (or at Close),
//	                                        and otherwise given back unsettled, with the same
//	                                        Attempt (see rebalance). MaxWait tops a batch up by
//	                                        further pulls
//	every group sees every record         exact (a durable consumer per group and partition)
//	one consumer per partition in a       pinned-client priority group as the fence; a sticky
//	  group, balanced                       deal over the live members (a KV bucket with TTL),
//	                                        stored on the server so every broker deals alike
//	rebalance without redelivery          on clean joins and leaves: a record a stopping
//	                                        worker had pulled but not delivered goes to the next
//	                                        local owner, or back to the server as never delivered
//	                                        (the consumer reset to it), so the next owner in any
//	                                        broker delivers it within its poll wait, Attempt 1
//	                                        (a record being retried is Nak'ed instead, and comes
//	                                        with Attempt+1); after a member crashes the one
//	                                        record it had in flight comes again after AckWait,
//	                                        Attempt+1
//	a server crash (R1; or all of a       records committed in about the last 100ms before the
//	  partition's replicas)                 crash come again, with Attempt 1 and from the same
//	                                        member, offsets going back: the server writes a
//	                                        consumer's state to disk at most about ten times a
//	                                        second (measured over nine SIGKILLs: 10-291 records
//	                                        over four partitions, committed up to 107ms before).
//	                                        Handlers must deduplicate on Message.ID, which is
//	                                        the same every time a record comes
//	a lost server of R3 or R5             nothing acknowledged is lost; what it led stalls
//	                                        until the others elect new leaders: see Replicas
//	durability                            a PubAck means the record reached the operating
//	                                        system on the partition's server (R1) or on most of
//	                                        its replicas (R3: two of three), so a crashed server
//	                                        process loses nothing acknowledged (measured); the
//	                                        disk is synced every two minutes, so a power loss may
//	                                        lose up to that, unless the server syncs every write
//	                                        (StartServer's WithSyncAlways, or the server's
//	                                        sync_interval: always), at a cost
//	failure detection                     seconds (member TTL, AckWait), not microseconds; a
//	                                        lost server's leaderships, 4-9s (Replicas)
//	retries, backoff, MaxAttempts         exact; attempts counted by the server, so they
//	                                        survive failover (NakWithDelay for the backoff)
//	dead letters, DeadLetters()           a stream per group, read newest first by batches (a
//	                                        read cut short keeps the newest; LatestDeadLetters
//	                                        says so with an error): they survive restarts
//	                                        (WithDeadLetterLimit(0) stores none, as in memory). A
//	                                        letter too big for the server is stored smaller: its
//	                                        error text cut to MaxErrorText, then without the
//	                                        record's value (DeadLetter.Truncated; Redrive refuses
//	                                        it). One the server refuses even so is tried
//	                                        MaxAttempts times, the handler not run again, then
//	                                        dropped: counted in DeadLettered and
//	                                        DeadLettersEvicted, reported (OnDeadLetter, Evicted,
//	                                        logged), and the partition moves on; one the server
//	                                        cannot be asked to store is tried until it can
//	                                        (Snapshot: Retrying). Errors
//	                                        read back match the same sentinels, with the text only
//	Group.Redrive                         a redrive stream per group (work queue, a subject and a
//	                                        pinned consumer per partition): a letter leaves the
//	                                        dead letters once its copy is stored there, and the
//	                                        partition's owner, in whichever broker, delivers it
//	                                        before its next pull (an idle worker within a poll
//	                                        wait), attempts from 1 counted by the server. It
//	                                        survives restarts and failover (a member that dies
//	                                        holding one: the next owner delivers it after
//	                                        AckWait, Attempt+1); Close leaves what is queued on
//	                                        the server, delivered when the group next runs,
//	                                        instead of putting it back in DeadLetters. Redriven
//	                                        counts this broker's Redrive calls
//	WithStuckAfter                        this process's deliveries only, sampled as in memory
//	                                        (reported after 1-1.5 thresholds; RunningFor in
//	                                        Snapshot); a handler running in another broker is
//	                                        that broker's to report
//	commit after nil                      an ack; while records flow it carries the pull for
//	                                        the next record and waits for no reply (the server
//	                                        sends the next record once it read the ack), and it is
//	                                        confirmed (DoubleAck) when the partition runs dry, is
//	                                        held or moves; an ack that fails on the client may
//	                                        still have committed, and one lost with the connection
//	                                        brings the record again after AckWait, Attempt+1:
//	                                        handlers must be idempotent
//	Seek, Replay, StartAt (offset, time)  exact, by resetting the consumer (time: the server's)
//	Pause / Resume                        the server's consumer pause (redrive consumers too):
//	                                        acts across processes (a broker that paused follows
//	                                        another's Resume within MemberTTL/3)
//	Lag, Committed, Stats                 from each stream's last sequence and the consumer's
//	                                        ack floor (the server's NumPending lags publishes);
//	                                        while the server cannot be asked, what was last read,
//	                                        never 0 or -1 (Snapshot: Unavailable, Observed)
//	errors of calls that need the server  wrap ErrUnavailable (connection lost, no responders,
//	                                        no quorum, a request timeout); Ping asks the server
//	a failed Publish                      stored nothing, unless its error wraps
//	                                        ErrOutcomeUnknown (sent, never answered); within ctx
//	                                        the engine waits out an outage and sends again under
//	                                        the record's message ID, stored once. The server holds
//	                                        each ID for its duplicate window (2 minutes): about
//	                                        100 bytes of its memory per record published in that
//	                                        time (measured), and the ID's header is stored
//	PublishAsync, Flush                   many records in flight per partition on the broker's
//	                                        connection (WithMaxInFlight per topic), stored in call
//	                                        order; a failure is recovered by asking the server
//	                                        about each record in doubt (under its message ID) and
//	                                        sending the first one not stored again, never after
//	                                        a later one, so nothing is stored twice or reordered.
//	                                        Not GaplessAsync: a record the server refuses while it
//	                                        stores a later one (MaxBytes, room made between them)
//	                                        leaves a gap, reported record by record. Every
//	                                        Pending resolves within three request timeouts
//	                                        of being sent (plus BlockTimeout under Block)
//	Message.Created, MaxAge               the server's clock; WithClock is refused (ErrInvalid)
//	Message.ID                            "<stream>-<sequence>"; WithIDs is refused (ErrInvalid)
//	DropOldest                            discard-old; Dropped counts evictions while MaxAge is 0
//	Block, BlockTimeout, ErrBackpressure  discard-new: a full partition first purges its oldest
//	                                        record if every group committed it; if not, the publisher
//	                                        retries (1–20ms apart) until BlockTimeout, then fails
//	                                        naming the slowest group. A partition no group reads
//	                                        drops its oldest record instead. Approximate: measured
//	                                        from the server's ack floors, polled
//	MaxBytes                              the server's byte limit, which counts headers and
//	                                        subject too
//	counters                              Reclaimed, Dropped (with MaxAge), Blocked, TimedOut,
//	                                        Delivered, Retried, DeadLettered, Skipped count what
//	                                        this process saw; Expired is not counted
//	a Stream delivery given back unread   same Attempt (GiveBack), within a broker and across
//	                                        (see rebalance), unless Close gave up first
//	keys and headers                      exact bytes, invalid UTF-8 included, in one binary
//	                                        header: at most MaxKeyAndHeadersSize together, and
//	                                        the whole record within the server's max_payload
//	                                        (1 MiB by default), else ErrInvalid at publish
//	Drain                                 waits for the groups this broker joined (their
//	                                        redriven letters too), polling the server every
//	                                        20ms (local commits wake it at once)
//	Close(ctx)                            as documented, also with the server down (what was
//	                                        left is then as last observed, and the error wraps
//	                                        ErrUnavailable); ShutdownError names the partitions of
//	                                        this broker's groups that no other broker carries on,
//	                                        which drain only what this broker owns; reads after
//	                                        Close answer from what Close saw last
//	DeleteGroup, DeleteTopic              on the server; other brokers stop their members once
//	                                        they see the deal deleted or a pull finds no consumer
//	Broker.Snapshot                       topics, partitions, committed offsets, lag and
//	                                        Oldest from the server (Oldest by its clock, Taken
//	                                        by this process's); owners and consumers from the
//	                                        deal; InFlight, Retrying and Attempt only for this
//	                                        broker's own deliveries, and so RunningFor;
//	                                        Redriving from the server; lists the groups this
//	                                        broker created, joined or named
//	membership                            a consumer name is one member across brokers: joining
//	                                        with a name another broker holds is ErrSubscription,
//	                                        and so is a name whose broker crashed, until its key
//	                                        expires (MemberTTL). Heartbeats run on their own, so
//	                                        a slow request of the broker's never lets its keys
//	                                        expire. The buckets are on file; a broker makes them
//	                                        again if the server lost them (a deletion; memory
//	                                        buckets of older versions across a restart), and
//	                                        its watches follow; while it cannot read them it
//	                                        keeps the deal it had, logs a warning and shows the
//	                                        error in the Snapshot (GroupSnapshot.MembershipErr)
//
// A partition's worker acts on Pause, Seek, Replay, a rebalance and Close
// between pulls, so on an idle partition they wait up to the poll wait
// (WithPollWait, 250ms by default). One record in flight per partition is
// what keeps order. The ack of a record carries the pull for the next and
// waits for no reply, so a record costs one message each way, as with the
// raw nats.go client's Consume and asynchronous acks. Consuming a backlog
// of four partitions, that is about 44 thousand records a second, 0.8 of
// the raw client doing the same work (embedded server, a shared 2-core
// machine, bench/README.md); publishing and consuming at once, 0.8 of it
// for one partition fed by PublishBatch (about 25 thousand), but 0.5 for
// four (about 18 thousand), where the publisher bounds it: a PublishBatch
// over four partitions makes short runs, and each run's first record
// waits for its PubAck. In BenchmarkPublishConsume the per-record
// consumer handles about 20-23 thousand records a second for one
// partition or four. A batch consumer (Topic.SubscribeBatch) takes up to
// its batch size per pull, call and commit: about 55-60 thousand records a
// second for one partition in the same benchmark (consumer=batch), 2.5-3
// times the per-record consumer and half of publishing alone
// (consumer=none). With four partitions fed by short
// runs a pull finds one or two records, and a batch consumer does no
// better than a per-record one unless WithBatchWait lets batches form
// (5ms: about 30 thousand against 26).
//
// Broker.Capabilities says what it keeps of the promises only some
// engines do: all but an injected clock and custom IDs (the server stamps
// and names records), an exact Block (it polls the server's ack floors)
// and virtual time (the nats.go client cannot run in a synctest bubble).
// It is also a Pinger.
//
// The engine's events reach the hooks and the logger as this process sees
// them: retries and dead letters of its own deliveries (a dead letter's
// Evicted from what this process stored); a rebalance whenever the
// assignment this broker follows changes (before and after as this
// broker saw the deal, so a change made while it was not looking is one
// event); backpressure waits and timeouts of its own publishes; drops by
// the purge of a full partition no group reads, and by discard-old on a
// DropOldest partition bounded by count alone (told from the sequence
// each publish stored: evictions under MaxAge or MaxBytes, and those
// before the broker attached, are not reported); skips its workers find;
// stuck handlers of its own deliveries. Expiries are not reported (the
// server trims by age unseen).
//
// # Replicas
//
// WithReplicas sets how many servers of a cluster keep each stream,
// consumer and bucket the engine creates. What each count survives and
// costs, measured on a cluster of three servers on one machine's
// loopback (2 shared cores; bench/README.md has the commands):
//
//   - R1, the default: each partition, consumer and bucket lives on one
//     server. When that server is lost, what lives there stops until it
//     comes back: publishes to its partitions fail, their groups get
//     nothing, and if it holds the membership buckets no broker can open
//     and no group can follow its membership. Nothing acknowledged is
//     lost once it is back on its store. The server places R1 streams by
//     free storage, which on the cluster measured put every partition of
//     every topic on one server; the engine cannot move them.
//   - R3: each lives on three servers, and an acknowledgement means two
//     of them have it. When one server is lost nothing acknowledged is
//     lost, and what it led stalls until the other two elect new leaders,
//     4-9s after the loss (the server's Raft election timeout): meanwhile
//     publishes to those partitions fail (time out) and their deliveries
//     wait. Measured over seven SIGKILLs of a server leading two of six
//     partitions, under a producer and a group of two: every partition
//     took publishes again within 5.0-7.5s of the kill and handled a new
//     record within 6.3-8.2s, every stream, consumer and bucket had a
//     leader within 6.5-8.5s, and a broker opened then joined the group
//     in 30-170ms; no acknowledged record was lost, no member dropped out
//     (MemberTTL 5s), and no record came again with the same Attempt (the
//     few whose acks went with the dead server's connections came after
//     AckWait, Attempt+1). Opening a broker, creating a topic or
//     subscribing while an election is pending may fail (the server's
//     JetStream is "temporarily unavailable", or a request times out):
//     try again. When
//     two of the three are lost, what they kept stops as with R1. It
//     costs: publishing about half as fast (one Publish at a time 2.7k
//     records a second against 4.9k for R1; PublishBatch of 64, 22k
//     against 42k), three times the storage, and more time to create a
//     topic and a group (about 0.6s and 1.5s for six partitions).
//   - R5: five servers, two of which may be lost; an acknowledgement
//     waits for three. Not measured here; it costs more than R3 in the
//     same ways.
//
// The server picks the leader of a replicated stream or consumer at
// random among its replicas, which often put four of six partitions on
// one server of three. The engine spreads the leaders of a new topic's
// partitions, and of a new group's consumers, evenly over the servers
// (with the server's leader stepdown), so that a topic's publishes and
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
