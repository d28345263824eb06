package jetstream

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/logbus/logbus/engine"
	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
)

// topic is a topic of this engine: one stream per partition.
type topic struct {
	e       *eng
	name    string
	spec    engine.TopicSpec
	parts   int
	streams []natsjs.Stream
	counts  []partCounts
	seen    []atomic.Pointer[streamSeen] // each partition's stream as last read from the server
	pipes   []*pipeline                  // each partition's asynchronous publishes (async.go)
	// deleted is set once DeleteTopic deleted the topic (in this broker,
	// or found it deleted by another): every call then fails with
	// ErrTopicNotFound.
	deleted atomic.Bool
}

// partCounts are what this process saw happen to a partition; the server
// keeps no such counters.
type partCounts struct {
	reclaimed, dropped, blocked, timedOut atomic.Int64
	// evicted is how many records this process has reported (EventDrop)
	// as evicted by the server's discard-old, for sawStored.
	evicted atomic.Int64
	// stored is the highest sequence a publish of this process stored, so
	// that what was last observed of the stream (topic.stream) counts it.
	stored atomic.Uint64
}

// sawStored notes that partition p stored a record at seq, and reports,
// when something observes, the records the server's
// discard-old evicted from partition p to store the record at seq: on a
// DropOldest partition bounded by count alone (no MaxAge, no MaxBytes),
// storing seq means that the records up to seq − MaxMessages are gone,
// and what this process has not reported yet is reported now. Nothing is
// asked of the server. With MaxAge or MaxBytes the evictions cannot be
// told from the sequence, and are not reported.
func (t *topic) sawStored(p int, seq uint64) {
	for c := &t.counts[p]; ; {
		if was := c.stored.Load(); was >= seq || c.stored.CompareAndSwap(was, seq) {
			break
		}
	}
	r := t.spec.Retention
	if t.e.obs == nil || r.OnFull != engine.DropOldest || r.MaxMessages <= 0 || r.MaxAge != 0 || r.MaxBytes > 0 {
		return
	}
	gone := int64(seq) - int64(r.MaxMessages)
	c := &t.counts[p]
	for {
		was := c.evicted.Load()
		if gone <= was {
			return
		}
		if c.evicted.CompareAndSwap(was, gone) {
			t.e.obs.Observe(&engine.Event{Kind: engine.EventDrop, Topic: t.name, Partition: p, Count: gone - was})
			return
		}
	}
}

// CreateTopic creates (or, when another broker created it with the same
// configuration, attaches to) the topic's streams. A name this broker
// already created, or streams that exist with another configuration (a
// different partition count or retention), is ErrTopicExists.
func (e *eng) CreateTopic(ctx context.Context, name string, spec engine.TopicSpec) (engine.Topic, error) {
	if err := e.refuse(fmt.Sprintf("create topic %q", name)); err != nil {
		return nil, err
	}
	spec, err := spec.Resolve(name)
	if err != nil {
		return nil, err
	}
	if err := e.names.checkTopic(name, spec.Partitions); err != nil {
		return nil, err
	}
	e.mu.Lock()
	_, taken := e.topics[name]
	e.mu.Unlock()
	if taken {
		return nil, fmt.Errorf("topic %q: %w", name, engine.ErrTopicExists)
	}
	t := &topic{e: e, name: name, spec: spec, parts: spec.Partitions,
		streams: make([]natsjs.Stream, spec.Partitions), counts: make([]partCounts, spec.Partitions),
		seen: make([]atomic.Pointer[streamSeen], spec.Partitions)}
	t.pipes = e.newPipes(t)
	for p := range spec.Partitions {
		s, err := e.createStream(ctx, t.streamConfig(p), false)
		if err != nil {
			if errors.Is(err, natsjs.ErrStreamNameAlreadyInUse) {
				return nil, fmt.Errorf("topic %q exists on the server with another configuration: %w", name, engine.ErrTopicExists)
			}
			return nil, e.ctxErr(ctx, fmt.Errorf("create topic %q partition %d: %w", name, p, err))
		}
		t.streams[p] = s
		t.observeStream(p, s.CachedInfo())
		// Evictions before this broker attached are not its to report.
		if last, n := s.CachedInfo().State.LastSeq, spec.Retention.MaxMessages; n > 0 && last > uint64(n) {
			t.counts[p].evicted.Store(int64(last) - int64(n))
		}
	}
	if empty := !slices.ContainsFunc(t.streams, func(s natsjs.Stream) bool { return s.CachedInfo().State.LastSeq > 0 }); empty {
		// A new topic (or one nothing was ever published to): its leaders
		// are spread over the cluster before anything is published.
		assets := make([]leaderOf, len(t.streams))
		for p, s := range t.streams {
			assets[p] = leaderOf{stepdown: "STREAM.LEADER.STEPDOWN." + s.CachedInfo().Config.Name,
				cluster: s.CachedInfo().Cluster, info: func(ctx context.Context) (*natsjs.ClusterInfo, error) {
					info, err := s.Info(ctx)
					if err != nil {
						return nil, err
					}
					return info.Cluster, nil
				}}
		}
		e.spreadLeaders(ctx, assets)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, taken := e.topics[name]; taken {
		return nil, fmt.Errorf("topic %q: %w", name, engine.ErrTopicExists)
	}
	e.topics[name] = t
	return t, nil
}

func (t *topic) streamConfig(p int) natsjs.StreamConfig {
	r := t.spec.Retention
	cfg := natsjs.StreamConfig{
		Name:      t.e.names.stream(t.name, p),
		Subjects:  []string{t.e.names.subject(t.name, p)},
		Retention: natsjs.LimitsPolicy,
		MaxMsgs:   int64(r.MaxMessages),
		MaxBytes:  -1,
		MaxAge:    r.MaxAge,
		Discard:   natsjs.DiscardOld,
		Storage:   natsjs.FileStorage,
		Metadata: map[string]string{
			"logbus_topic":      t.name,
			"logbus_partitions": strconv.Itoa(t.parts),
		},
	}
	if r.MaxBytes > 0 {
		cfg.MaxBytes = r.MaxBytes
	}
	if r.OnFull == engine.Block {
		cfg.Discard = natsjs.DiscardNew
	}
	if t.e.cfg.storage == MemoryStorage {
		cfg.Storage = natsjs.MemoryStorage
	}
	return cfg
}

func (t *topic) Name() string    { return t.name }
func (t *topic) Partitions() int { return t.parts }

// NewRecord returns a new record: this engine reclaims no buffers.
func (t *topic) NewRecord() *engine.Record { return &engine.Record{} }

func (t *topic) NewRecords(recs []*engine.Record) {
	for i := range recs {
		recs[i] = &engine.Record{}
	}
}

// message is rec as a NATS message on partition p's subject (meta.go
// says how it carries the key and headers), under a message ID of its own
// (Nats-Msg-Id: see [ErrOutcomeUnknown]). The ID is the broker's random
// instance and a count of its publishes: the engine's attempts of one
// publish share it, so the server stores it once, while two publishes of
// equal records are two records. The server keeps each ID for the
// stream's duplicate window (its default, two minutes: a stream made with
// another window would not match one an older broker made): about 100
// bytes of server memory per record published in that time, measured on
// nats-server 2.15. A record the server would refuse for its size is
// refused here, with ErrInvalid.
func (t *topic) message(p int, rec *engine.Record) (*nats.Msg, error) {
	m := nats.NewMsg(t.e.names.subject(t.name, p))
	m.Data = rec.Value
	m.Header.Set(natsjs.MsgIDHeader, t.e.nextMsgID())
	if err := setMeta(m.Header, rec); err != nil {
		return nil, err
	}
	if limit, size := t.e.js.Conn().MaxPayload(), int64(headerLen(m.Header)+len(m.Data)); limit > 0 && size > limit {
		return nil, fmt.Errorf("%w: the record takes %d bytes as a message (its value %d), over the server's max_payload of %d",
			engine.ErrInvalid, size, len(m.Data), limit)
	}
	return m, nil
}

// AppendOne publishes rec to partition p and returns its offset, the
// stream sequence minus one. Under Block, a full partition first gets room
// by purging what every group committed; when there is none, Publish
// waits, polling, at most BlockTimeout and never past ctx, then fails with
// ErrBackpressure naming the slowest group.
func (t *topic) AppendOne(ctx context.Context, p int, rec *engine.Record) (int64, error) {
	if err := t.e.refuse("publish"); err != nil {
		return 0, err
	}
	if p < 0 || p >= t.parts {
		return 0, fmt.Errorf("%w: topic %q has no partition %d", engine.ErrInvalid, t.name, p)
	}
	m, err := t.message(p, rec)
	if err != nil {
		return 0, err
	}
	return t.publish(ctx, p, m)
}

func (t *topic) publish(ctx context.Context, p int, m *nats.Msg) (int64, error) {
	var deadline time.Time
	wait := time.Millisecond
	var try tries
	for {
		ack, err := t.send(ctx, p, m, &try)
		if err == nil {
			t.sawStored(p, ack.Sequence)
			return int64(ack.Sequence) - 1, nil
		}
		if !isFull(err) {
			return 0, err
		}
		if err := t.refuseDeleted(); err != nil { // DeleteTopic fails a publisher waiting for room
			return 0, err
		}
		freed, slowest, rerr := t.reclaim(ctx, p)
		if errors.Is(rerr, natsjs.ErrStreamNotFound) {
			t.markDeleted() // by another broker
			return 0, t.refuseDeleted()
		}
		if rerr != nil {
			return 0, try.failed(t, ctx, p, rerr)
		}
		if freed > 0 {
			continue
		}
		if deadline.IsZero() { // no room to be made: this publish waits
			t.counts[p].blocked.Add(1)
			deadline = time.Now().Add(t.spec.Retention.BlockTimeout)
			if obs := t.e.obs; obs != nil {
				obs.Observe(&engine.Event{Kind: engine.EventBackpressureWait, Topic: t.name, Partition: p})
			}
		}
		left := time.Until(deadline)
		if left <= 0 {
			t.counts[p].timedOut.Add(1)
			var err error
			if slowest != "" {
				err = fmt.Errorf("topic %q partition %d stayed full for %v; group %q holds the oldest record: %w",
					t.name, p, t.spec.Retention.BlockTimeout, slowest, engine.ErrBackpressure)
			} else {
				err = fmt.Errorf("topic %q partition %d stayed full for %v: %w",
					t.name, p, t.spec.Retention.BlockTimeout, engine.ErrBackpressure)
			}
			if obs := t.e.obs; obs != nil {
				obs.Observe(&engine.Event{Kind: engine.EventBackpressureTimeout, Topic: t.name, Partition: p,
					Delay: t.spec.Retention.BlockTimeout - left, Err: err})
			}
			return 0, err
		}
		if !sleepCtx(ctx, t.e.closing, min(wait, left)) {
			return 0, try.failed(t, ctx, p, cmpErr(ctx.Err(), engine.ErrClosed))
		}
		wait = min(2*wait, 20*time.Millisecond)
	}
}

// tries is what the attempts of one publish have done so far.
type tries struct {
	// sent is set once an attempt went to the server and its answer
	// never came: from then on a failure leaves the outcome unknown.
	sent bool
	// until bounds the attempts through an outage when ctx has no
	// deadline: the request timeout from the first failed attempt.
	until time.Time
}

// noRetry stops nats.go from retrying a publish that found no responders:
// send retries, and must know what each attempt did.
var noRetry = natsjs.WithRetryAttempts(0)

// send stores m, a record of partition p, trying again through an outage.
// While the connection is down it waits for it, rather than hand m to the
// client's reconnect buffer, which would flush it after the reconnect
// whatever became of the call. After an attempt that found no stream to
// answer (a server restarting, a stream without a leader), or got no
// answer in time, it sends m again under the same message ID, so that a
// record the server stored already is not stored twice: the answer is then
// the stored copy's sequence. It gives up when ctx ends (or, when ctx has
// no deadline, the request timeout after the first failure) and then says
// whether m may have been stored ([ErrOutcomeUnknown]). The server's
// refusal of a full partition (isFull) is returned as it is, for the
// caller to make room.
func (t *topic) send(ctx context.Context, p int, m *nats.Msg, try *tries) (*natsjs.PubAck, error) {
	pause := 5 * time.Millisecond
	for {
		if err := t.refuseDeleted(); err != nil {
			return nil, err
		}
		if err := t.e.awaitConnection(ctx, try); err != nil {
			return nil, try.failed(t, ctx, p, err)
		}
		actx, cancel := t.e.attempt(ctx)
		ack, err := t.e.js.PublishMsg(actx, m, noRetry)
		cancel()
		switch {
		case err == nil, isFull(err):
			return ack, err
		case errors.Is(err, nats.ErrNoResponders), errors.Is(err, natsjs.ErrNoStreamResponse):
			// Nobody took it: not stored by this attempt. A stream that
			// is gone was deleted (DeleteTopic, maybe by another broker).
			if gone := t.checkDeleted(ctx, p); gone != nil {
				return nil, gone
			}
		case errors.Is(err, nats.ErrReconnectBufExceeded):
			// Refused by the client: not sent.
		case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled), errors.Is(err, nats.ErrTimeout),
			errors.Is(err, nats.ErrConnectionClosed), errors.Is(err, nats.ErrDisconnected):
			try.sent = true // sent, or in the client's buffer: it may yet be stored
		default: // the server answered: not stored
			return nil, try.failed(t, ctx, p, err)
		}
		if !try.more(ctx, t.e) {
			return nil, try.failed(t, ctx, p, err)
		}
		if !sleepCtx(ctx, t.e.closing, pause) {
			return nil, try.failed(t, ctx, p, cmpErr(ctx.Err(), engine.ErrClosed))
		}
		pause = min(2*pause, 250*time.Millisecond)
	}
}

// more reports whether a publish may try again after a failed attempt:
// while ctx lasts, and when ctx has no deadline, for the request timeout
// from the first failure.
func (try *tries) more(ctx context.Context, e *eng) bool {
	if _, ok := ctx.Deadline(); ok {
		return ctx.Err() == nil
	}
	if try.until.IsZero() {
		try.until = time.Now().Add(e.cfg.requestTimeout)
	}
	return time.Now().Before(try.until)
}

// failed is the error of a publish that gave up because of cause: it wraps
// [ErrOutcomeUnknown] when an attempt may have been stored and says "not
// stored" otherwise; it wraps ErrClosed once Close began, and
// ErrUnavailable as ctxErr classifies cause.
func (try *tries) failed(t *topic, ctx context.Context, p int, cause error) error {
	if errors.Is(cause, engine.ErrTopicNotFound) {
		return cause
	}
	if t.e.refuse("") != nil && !errors.Is(cause, engine.ErrClosed) {
		cause = fmt.Errorf("%w (%w)", engine.ErrClosed, cause)
	}
	if try.sent {
		return t.e.ctxErr(ctx, fmt.Errorf("partition %d: %w: %w", p, ErrOutcomeUnknown, cause))
	}
	return t.e.ctxErr(ctx, fmt.Errorf("partition %d: not stored: %w", p, cause))
}

// awaitConnection returns nil once the connection is up, or the error that
// ended the wait: ctx's, ErrClosed when Close begins, the connection
// closed for good, or, when ctx has no deadline, the bound of try.
func (e *eng) awaitConnection(ctx context.Context, try *tries) error {
	for pause := time.Millisecond; ; pause = min(2*pause, 20*time.Millisecond) {
		switch e.js.Conn().Status() {
		case nats.CONNECTED:
			return nil
		case nats.CLOSED:
			return nats.ErrConnectionClosed
		}
		if !try.more(ctx, e) {
			return nats.ErrDisconnected
		}
		if !sleepCtx(ctx, e.closing, pause) {
			return cmpErr(ctx.Err(), engine.ErrClosed)
		}
	}
}

// sleepCtx waits d: false when ctx ended or stop closed first.
func sleepCtx(ctx context.Context, stop <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	case <-stop:
		return false
	}
}

// cmpErr returns the first of errs that is not nil.
func cmpErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// isFull reports the server's refusal of a record by a full discard-new
// stream (maximum messages or bytes).
func isFull(err error) bool {
	var apiErr *natsjs.APIError
	if errors.As(err, &apiErr) && apiErr.ErrorCode == 10077 {
		return true
	}
	s := err.Error()
	return strings.Contains(s, "maximum messages exceeded") || strings.Contains(s, "maximum bytes exceeded")
}

// reclaim makes room in full partition p: it purges its oldest record
// when every group has committed past it (counted as reclaimed), or when
// no group reads the partition (counted as dropped). That costs three
// requests per publish to a full partition. It returns
// how many records it freed and the group with the lowest ack floor.
func (t *topic) reclaim(ctx context.Context, p int) (int64, string, error) {
	s := t.streams[p]
	info, err := s.Info(ctx)
	if err != nil {
		return 0, "", err
	}
	first := info.State.FirstSeq
	var floor uint64
	var slowest string
	found := false
	for ci := range s.ListConsumers(ctx).Info() {
		if !found || ci.AckFloor.Stream < floor {
			floor, slowest = ci.AckFloor.Stream, ci.Name
			if g, ok := ci.Config.Metadata["logbus_group"]; ok {
				slowest = g
			}
		}
		found = true
	}
	if !found {
		if info.State.Msgs == 0 {
			return 0, "", nil
		}
		keep := uint64(max(t.spec.Retention.MaxMessages-1, 0))
		if info.State.Msgs <= keep { // full by bytes: drop one
			keep = info.State.Msgs - 1
		}
		if err := s.Purge(ctx, natsjs.WithPurgeKeep(keep)); err != nil {
			return 0, "", err
		}
		n := int64(info.State.Msgs - keep)
		t.counts[p].dropped.Add(n)
		if obs := t.e.obs; obs != nil {
			obs.Observe(&engine.Event{Kind: engine.EventDrop, Topic: t.name, Partition: p, Count: n})
		}
		return n, "", nil
	}
	if floor < first {
		return 0, slowest, nil
	}
	// One record, the oldest, as the in-memory engine frees them: the
	// records every group committed stay for replay until room is needed.
	if err := s.Purge(ctx, natsjs.WithPurgeSequence(first+1)); err != nil {
		return 0, slowest, err
	}
	t.counts[p].reclaimed.Add(1)
	return 1, slowest, nil
}

// AppendBatch publishes each run of records in order: the first as
// AppendOne does (waiting for room under Block), the rest asynchronously,
// each expecting the stream's last message to be its predecessor (by
// message ID). So a run that succeeds is stored contiguously, and one the
// server refuses in part (a full Block partition, a record of another
// publisher in between) stores a prefix and nothing after it; the rest
// then goes one record at a time, as AppendOne, under the same message
// IDs, so that a record whose answer was lost is not stored twice. When
// ctx ends while records of a run wait for their answers, the error wraps
// [ErrOutcomeUnknown]: the first record not counted may have been stored,
// and so may the ones after it.
func (t *topic) AppendBatch(ctx context.Context, partitions []int, recs []*engine.Record, offsets []int64) (int, error) {
	if err := t.e.refuse("publish"); err != nil {
		return 0, err
	}
	if err := t.refuseDeleted(); err != nil {
		return 0, err
	}
	for start, end := range engine.Runs(partitions) {
		p := partitions[start]
		if p < 0 || p >= t.parts {
			return start, fmt.Errorf("%w: topic %q has no partition %d", engine.ErrInvalid, t.name, p)
		}
		msgs := make([]*nats.Msg, end-start)
		for i := range msgs {
			m, err := t.message(p, recs[start+i])
			if err != nil {
				return start, err
			}
			msgs[i] = m
		}
		off, err := t.publish(ctx, p, msgs[0])
		if err != nil {
			return start, err
		}
		offsets[start] = off
		futs := make([]natsjs.PubAckFuture, len(msgs))
		sent := 1
		for i := 1; i < len(msgs) && t.e.connected(); i++ {
			f, err := t.e.js.PublishMsgAsync(msgs[i], natsjs.WithExpectLastMsgID(msgs[i-1].Header.Get(natsjs.MsgIDHeader)))
			if err != nil {
				break
			}
			futs[i] = f
			sent++
		}
		// A stored record proves every one before it stored, just before
		// it: each expected its predecessor to be the stream's last.
		// Answers that do not come within ctx (or the request timeout,
		// when ctx has no deadline), or before the connection is lost, are
		// not waited for: the records from the first unanswered one go
		// again one at a time, under their message IDs, so a stored one is
		// found stored.
		lost := t.e.lost()
		var timeout <-chan time.Time
		if _, ok := ctx.Deadline(); !ok && sent > 1 {
			tm := time.NewTimer(t.e.cfg.requestTimeout)
			defer tm.Stop()
			timeout = tm.C
		}
		stored := 1
		var firstErr error
	wait:
		for i := 1; i < sent; i++ {
			select {
			case ack := <-futs[i].Ok():
				stored = i + 1
				offsets[start+i] = int64(ack.Sequence) - 1
			case err := <-futs[i].Err():
				if firstErr == nil {
					firstErr = err
				}
			case <-ctx.Done():
				try := tries{sent: true}
				return start + stored, try.failed(t, ctx, p, ctx.Err())
			case <-lost:
				break wait
			case <-timeout:
				break wait
			}
		}
		if stored > 1 {
			t.sawStored(p, uint64(offsets[start+stored-1])+1)
		}
		if firstErr != nil && stored < sent && !isFull(firstErr) && !isWrongSequence(firstErr) && !unreachable(firstErr) {
			try := tries{}
			return start + stored, try.failed(t, ctx, p, firstErr)
		}
		for i := start + stored; i < end; i++ {
			m := msgs[i-start]
			m.Header.Del(natsjs.ExpectedLastMsgIDHeader) // alone now: whatever is last
			off, err := t.publish(ctx, p, m)
			if err != nil {
				return i, err
			}
			offsets[i] = off
		}
	}
	return len(recs), nil
}

// isWrongSequence reports a publish refused because the stream's last
// message was not the one it expected.
func isWrongSequence(err error) bool {
	var apiErr *natsjs.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == natsjs.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == natsjs.JSErrCodeStreamWrongLastSequenceConstant || apiErr.ErrorCode == 10070)
}

// Stats reads every partition's state from the server, bounded by the
// request timeout; what it cannot read (the server unreachable, or after
// Close) is the last it observed, never made up. Earliest, End, Retained
// and RetainedBytes are the server's (RetainedBytes counts what the server
// stores: headers and subject too); Reclaimed, Dropped, Blocked and
// TimedOut count what this process did; Expired is not counted.
func (t *topic) Stats() []engine.PartitionStats {
	r, cancel := t.e.read()
	defer cancel()
	out, _ := t.stats(r)
	return out
}

// stats is Stats within the read r; it also returns when the oldest of
// the values it serves was read from the server.
func (t *topic) stats(r *reading) ([]engine.PartitionStats, time.Time) {
	out := make([]engine.PartitionStats, t.parts)
	var observed time.Time
	for p := range t.parts {
		if r.ask() && !t.isDeleted() {
			_, err := t.streamInfo(r.ctx, p)
			r.got(err)
		}
		c := &t.counts[p]
		out[p] = engine.PartitionStats{Reclaimed: c.reclaimed.Load(), Dropped: c.dropped.Load(),
			Blocked: c.blocked.Load(), TimedOut: c.timedOut.Load()}
		st := t.stream(p)
		observed = observedAt(observed, st.at)
		out[p].End = int64(st.last)
		out[p].Earliest = int64(st.first) - 1
		if st.msgs == 0 {
			out[p].Earliest = out[p].End
		}
		out[p].Retained = int(st.msgs)
		out[p].RetainedBytes = int64(st.bytes)
		if t.spec.Retention.OnFull == engine.DropOldest && t.spec.Retention.MaxAge == 0 {
			// Every record gone from the front was dropped (by the
			// server's discard-old or by a purge).
			out[p].Dropped = out[p].Earliest - c.reclaimed.Load()
		}
	}
	return out, observed
}

// streamSeen is what the engine last read of a partition's stream.
type streamSeen struct {
	first, last, msgs, bytes uint64
	at                       time.Time
}

// observeStream records info as partition p's last observed state.
func (t *topic) observeStream(p int, info *natsjs.StreamInfo) {
	if info == nil {
		return
	}
	st := info.State
	t.seen[p].Store(&streamSeen{first: st.FirstSeq, last: st.LastSeq, msgs: st.Msgs, bytes: st.Bytes, at: time.Now()})
}

// streamInfo reads partition p's stream from the server, and records it.
func (t *topic) streamInfo(ctx context.Context, p int) (*natsjs.StreamInfo, error) {
	info, err := t.streams[p].Info(ctx)
	if err == nil {
		t.observeStream(p, info)
	}
	return info, err
}

// stream returns partition p's stream as last observed (CreateTopic
// observed it first), its end raised to the last record this broker
// stored since.
func (t *topic) stream(p int) *streamSeen {
	s := t.seen[p].Load()
	if s == nil {
		s = &streamSeen{}
	}
	if last := t.counts[p].stored.Load(); last > s.last {
		c := *s
		c.last = last
		s = &c
	}
	return s
}

// isDeleted reports whether the topic was deleted.
func (t *topic) isDeleted() bool { return t.deleted.Load() }

// refuseDeleted is ErrTopicNotFound once the topic was deleted.
func (t *topic) refuseDeleted() error {
	if t.isDeleted() {
		return errTopicDeleted
	}
	return nil
}

// checkDeleted asks whether partition p's stream still exists, after a
// publish found nobody to answer: when it does not, the topic was deleted
// (by another broker), and it returns why calls fail from now on. nil when
// it exists or the server cannot tell.
func (t *topic) checkDeleted(ctx context.Context, p int) error {
	ctx, cancel := t.e.bounded(ctx)
	defer cancel()
	if _, err := t.streams[p].Info(ctx); errors.Is(err, natsjs.ErrStreamNotFound) {
		t.markDeleted()
		return t.refuseDeleted()
	}
	return nil
}

// markDeleted makes every call on the topic fail with ErrTopicNotFound,
// and takes it out of the broker's registry, so that its name makes a new
// topic.
func (t *topic) markDeleted() {
	t.deleted.Store(true)
	t.e.mu.Lock()
	if t.e.topics[t.name] == t {
		delete(t.e.topics, t.name)
	}
	t.e.mu.Unlock()
}
