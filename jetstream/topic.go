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

	"github.com/logbus/logbus/internal/engine"
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
	snap    atomic.Pointer[[]engine.PartitionStats] // Stats as Close left them
}

// partCounts are what this process saw happen to a partition; the server
// keeps no such counters.
type partCounts struct {
	reclaimed, dropped, blocked, timedOut atomic.Int64
	// evicted is how many records this process has reported (EventDrop)
	// as evicted by the server's discard-old, for sawStored.
	evicted atomic.Int64
}

// sawStored reports, when something observes, the records the server's
// discard-old evicted from partition p to store the record at seq: on a
// DropOldest partition bounded by count alone (no MaxAge, no MaxBytes),
// storing seq means that the records up to seq − MaxMessages are gone,
// and what this process has not reported yet is reported now. Nothing is
// asked of the server. With MaxAge or MaxBytes the evictions cannot be
// told from the sequence, and are not reported.
func (t *topic) sawStored(p int, seq uint64) {
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
		streams: make([]natsjs.Stream, spec.Partitions), counts: make([]partCounts, spec.Partitions)}
	for p := range spec.Partitions {
		s, err := e.js.CreateStream(ctx, t.streamConfig(p))
		if err != nil {
			if errors.Is(err, natsjs.ErrStreamNameAlreadyInUse) {
				return nil, fmt.Errorf("topic %q exists on the server with another configuration: %w", name, engine.ErrTopicExists)
			}
			return nil, e.ctxErr(ctx, fmt.Errorf("create topic %q partition %d: %w", name, p, err))
		}
		t.streams[p] = s
		// Evictions before this broker attached are not its to report.
		if last, n := s.CachedInfo().State.LastSeq, spec.Retention.MaxMessages; n > 0 && last > uint64(n) {
			t.counts[p].evicted.Store(int64(last) - int64(n))
		}
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
// says how it carries the key and headers). A record the server would
// refuse for its size is refused here, with ErrInvalid.
func (t *topic) message(p int, rec *engine.Record) (*nats.Msg, error) {
	m := nats.NewMsg(t.e.names.subject(t.name, p))
	m.Data = rec.Value
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
	for {
		ack, err := t.e.js.PublishMsg(ctx, m)
		if err == nil {
			t.sawStored(p, ack.Sequence)
			return int64(ack.Sequence) - 1, nil
		}
		if !isFull(err) {
			return 0, t.publishErr(ctx, p, err)
		}
		freed, slowest, rerr := t.reclaim(ctx, p)
		if rerr != nil {
			return 0, t.publishErr(ctx, p, rerr)
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
		timer := time.NewTimer(min(wait, left))
		select {
		case <-ctx.Done():
			timer.Stop()
			return 0, fmt.Errorf("publish to topic %q partition %d: %w", t.name, p, ctx.Err())
		case <-t.e.closing:
			timer.Stop()
			return 0, fmt.Errorf("publish to topic %q partition %d: %w", t.name, p, engine.ErrClosed)
		case <-timer.C:
		}
		wait = min(2*wait, 20*time.Millisecond)
	}
}

func (t *topic) publishErr(ctx context.Context, p int, err error) error {
	if errors.Is(err, nats.ErrConnectionClosed) {
		err = fmt.Errorf("%w (%v)", engine.ErrClosed, err)
	}
	return t.e.ctxErr(ctx, fmt.Errorf("publish to topic %q partition %d: %w", t.name, p, err))
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
// each expecting the stream's last sequence to be its predecessor's. So a
// run that succeeds is stored contiguously, and one the server refuses in
// part (a full Block partition, a record of another publisher in
// between) stores a prefix and nothing after it; the rest then goes one
// record at a time, as AppendOne.
func (t *topic) AppendBatch(ctx context.Context, partitions []int, recs []*engine.Record, offsets []int64) (int, error) {
	if err := t.e.refuse("publish"); err != nil {
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
		first := uint64(off) + 1 // the run's first sequence
		futs := make([]natsjs.PubAckFuture, len(msgs))
		sent := 1
		for i := 1; i < len(msgs); i++ {
			f, err := t.e.js.PublishMsgAsync(msgs[i], natsjs.WithExpectLastSequence(first+uint64(i)-1))
			if err != nil {
				break
			}
			futs[i] = f
			sent++
		}
		// A stored record proves every one before it stored, at the
		// sequences the chain expected.
		stored := 1
		var firstErr error
		for i := 1; i < sent; i++ {
			select {
			case <-futs[i].Ok():
				stored = i + 1
			case err := <-futs[i].Err():
				if firstErr == nil {
					firstErr = err
				}
			case <-ctx.Done():
				return start + stored, fmt.Errorf("publish to topic %q partition %d: %w", t.name, p, ctx.Err())
			}
		}
		for i := 1; i < stored; i++ {
			offsets[start+i] = int64(first+uint64(i)) - 1
		}
		if stored > 1 {
			t.sawStored(p, first+uint64(stored)-1)
		}
		if firstErr != nil && stored < sent && !isFull(firstErr) && !isWrongSequence(firstErr) {
			return start + stored, t.publishErr(ctx, p, firstErr)
		}
		for i := start + stored; i < end; i++ {
			off, err := t.publish(ctx, p, msgs[i-start])
			if err != nil {
				return i, err
			}
			offsets[i] = off
		}
	}
	return len(recs), nil
}

// isWrongSequence reports a publish refused because the stream's last
// sequence was not the one it expected.
func isWrongSequence(err error) bool {
	var apiErr *natsjs.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == natsjs.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == natsjs.JSErrCodeStreamWrongLastSequenceConstant)
}

// Stats reads every partition's state from the server, bounded by the
// request timeout; a partition it cannot read reports only this process's
// counters. Earliest, End, Retained and RetainedBytes are the server's
// (RetainedBytes counts what the server stores: headers and subject
// too); Reclaimed, Dropped, Blocked and TimedOut count what this process
// did; Expired is not counted.
func (t *topic) Stats() []engine.PartitionStats {
	if snap := t.snap.Load(); snap != nil {
		return slices.Clone(*snap)
	}
	ctx, cancel := t.e.ctx()
	defer cancel()
	out := make([]engine.PartitionStats, t.parts)
	for p, s := range t.streams {
		c := &t.counts[p]
		out[p] = engine.PartitionStats{Reclaimed: c.reclaimed.Load(), Dropped: c.dropped.Load(),
			Blocked: c.blocked.Load(), TimedOut: c.timedOut.Load()}
		info, err := s.Info(ctx)
		if err != nil {
			continue
		}
		st := info.State
		out[p].End = int64(st.LastSeq)
		out[p].Earliest = int64(st.FirstSeq) - 1
		if st.Msgs == 0 {
			out[p].Earliest = out[p].End
		}
		out[p].Retained = int(st.Msgs)
		out[p].RetainedBytes = int64(st.Bytes)
		if t.spec.Retention.OnFull == engine.DropOldest && t.spec.Retention.MaxAge == 0 {
			// Every record gone from the front was dropped (by the
			// server's discard-old or by a purge).
			out[p].Dropped = out[p].Earliest - c.reclaimed.Load()
		}
	}
	return out
}
