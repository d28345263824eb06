package core

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"time"
)

// TopicConfig is what a topic is created with. Zero fields mean the defaults.
type TopicConfig struct {
	Partitions  int         // fixed for the topic's life; default 1
	Retention   Retention   // per partition
	Partitioner Partitioner // default KeyHash
}

// The limits of a topic's shape. A topic allocates its partitions when it
// is created, each with a ring slot (and a little more) per record of
// MaxMessages, committed at once whether or not records come (pubsub's
// Retention says what each costs). Without limits, a typo became an
// out-of-memory crash or a NewTopic that did not return: 1,000,000
// partitions of the default 1024 records ask for about 10 GB of
// bookkeeping. Past these limits a topic is ErrInvalid, naming the limit,
// before anything is allocated.
//
//   - MaxPartitions (65,536): partitions are the unit of parallelism, and
//     each group runs a goroutine per partition (a few KiB of stack each);
//     65,536 is far more than the cores of any machine can use, and their
//     fixed cost stays in the tens of MiB.
//   - MaxTopicMessages (16 Mi): partitions × MaxMessages, the ring slots
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

// resolve checks c and fills its zero fields with the defaults: with
// Retention.Resolve, the one place a topic's configuration is validated.
func (c TopicConfig) resolve(name string) (TopicConfig, error) {
	switch {
	case name == "":
		return c, fmt.Errorf("%w: empty topic name", ErrInvalid)
	case c.Partitions < 0:
		return c, fmt.Errorf("%w: topic %q: %d partitions", ErrInvalid, name, c.Partitions)
	case c.Partitions > MaxPartitions:
		return c, fmt.Errorf("%w: topic %q: %d partitions, over the limit of %d (MaxPartitions)",
			ErrInvalid, name, c.Partitions, MaxPartitions)
	}
	if c.Partitions == 0 {
		c.Partitions = 1
	}
	ret, err := c.Retention.Resolve()
	if err != nil {
		return c, fmt.Errorf("topic %q: %w", name, err)
	}
	c.Retention = ret
	// Both factors are bounded above (Resolve checked MaxMessages), so the
	// product fits in an int64.
	if slots := int64(c.Partitions) * int64(ret.MaxMessages); slots > MaxTopicMessages {
		return c, fmt.Errorf("%w: topic %q: %d partitions × MaxMessages %d = %d records, over the limit of %d (MaxTopicMessages)",
			ErrInvalid, name, c.Partitions, ret.MaxMessages, slots, MaxTopicMessages)
	}
	if c.Partitioner == nil {
		c.Partitioner = KeyHash()
	}
	return c, nil
}

// Topic is a named, fixed set of partitions and the rule that routes records
// to them.
type Topic struct {
	name        string
	broker      *Broker
	parts       []*Partition
	partitioner Partitioner
	free        sync.Pool // of *Record: reclaimed records, for NewRecord to reuse
	batches     sync.Pool // of *batch: see newBatch
}

func newTopic(b *Broker, name string, cfg TopicConfig) (*Topic, error) {
	cfg, err := cfg.resolve(name)
	if err != nil {
		return nil, err
	}
	ret := cfg.Retention
	t := &Topic{name: name, broker: b, partitioner: cfg.Partitioner, parts: make([]*Partition, 0, cfg.Partitions)}
	seq := int(b.topicSeq.Add(1))
	for i := range cfg.Partitions {
		part := newPartition(name, i, ret, b.ageClock, &t.free)
		if b.ids == nil {
			part.ids = newRecordIDs(b.idPrefix, seq, i, ret.MaxMessages)
		}
		t.parts = append(t.parts, part)
	}
	return t, nil
}

// Name returns the topic's name.
func (t *Topic) Name() string { return t.name }

// Partitions returns the number of partitions.
func (t *Topic) Partitions() int { return len(t.parts) }

// NewRecord returns an empty record for the caller to fill (Key, Value and
// Headers) and give to PublishRecord. It may be a record the topic
// reclaimed: then its Key and Value are empty slices over that record's
// buffers (at most maxReusedBuffer bytes each), which the caller may append
// to instead of allocating. Whoever does must be sure that nothing made from
// the earlier record still refers to those bytes: appending is safe only
// for a topic whose readers copy what they take from a record.
func (t *Topic) NewRecord() *Record {
	if rec, ok := t.free.Get().(*Record); ok {
		return rec
	}
	return new(Record)
}

// Publish appends a record to the partition its key routes to and returns
// where it landed: PublishRecord of a new record holding key, value and
// headers.
func (t *Topic) Publish(ctx context.Context, key, value []byte, headers map[string]string) (Position, error) {
	rec := t.NewRecord()
	rec.Key, rec.Value, rec.Headers = key, value, headers
	return t.PublishRecord(ctx, rec)
}

// PublishRecord appends rec, filled by the caller, to the partition its key
// routes to and returns where it landed. It takes ownership of rec and of
// its key and value: the caller must not touch them afterwards. Its headers
// are copied.
//
// It blocks only when the partition is full under Block (see
// Partition.Append). A done ctx fails the publish before anything is stored.
func (t *Topic) PublishRecord(ctx context.Context, rec *Record) (Position, error) {
	if err := t.publishable(ctx); err != nil {
		return Position{}, err
	}
	if err := t.prepare(rec, t.broker.clock.Now()); err != nil {
		return Position{}, err
	}
	part := rec.log
	var offset [1]int64
	if _, err := part.Append(ctx, []*Record{rec}, offset[:]); err != nil {
		return Position{}, err
	}
	return Position{Partition: part.index, Offset: offset[0]}, nil
}

// PublishBatch appends n records in order, each to the partition its key
// routes to, as PublishRecord would one by one, and returns how many it
// appended: all of them, or, with an error, the first ones. fill(i, rec)
// fills the i-th record, a NewRecord; PublishBatch takes ownership of its
// key and value, and copies its headers. landed, if not nil, is told where
// each appended record landed.
//
// Every record is filled, and routed, before anything is appended: an error
// from fill (returned as it is) or a partitioner that chooses no valid
// partition fails the batch with nothing appended.
//
// A batch costs much less than its records published one by one: the clock
// is read once (every record of the batch has the same Created), and each
// run of consecutive records for one partition is appended under one lock,
// with one wake-up for its readers. Records of one partition keep their
// batch order; another producer's records may land between two runs. Under
// Block the call waits for room as often as needed, each record at most
// BlockTimeout.
func (t *Topic) PublishBatch(ctx context.Context, n int, fill func(i int, rec *Record) error, landed func(i int, pos Position)) (int, error) {
	if err := t.publishable(ctx); err != nil {
		return 0, err
	}
	now := t.broker.clock.Now()
	batch := t.newBatch(n)
	defer t.releaseBatch(batch)
	recs, offsets := batch.recs, batch.offsets
	for i := range recs {
		recs[i] = batch.newRecord(t)
		if err := fill(i, recs[i]); err != nil {
			return 0, err
		}
		if err := t.prepare(recs[i], now); err != nil {
			return 0, fmt.Errorf("batch entry %d: %w", i, err)
		}
	}
	appended := 0
	for appended < len(recs) {
		part := recs[appended].log
		run := appended + 1
		for run < len(recs) && recs[run].log == part {
			run++
		}
		stored, freed, err := part.AppendReusing(ctx, recs[appended:run], offsets[appended:run], batch.free)
		batch.free = freed
		if landed != nil {
			for i := appended; i < appended+stored; i++ {
				landed(i, Position{Partition: part.index, Offset: offsets[i]})
			}
		}
		appended += stored
		if err != nil {
			return appended, err
		}
	}
	return appended, nil
}

// batch holds the records of a PublishBatch call and their offsets. It
// keeps the records its appends reclaimed for the next call that uses it,
// rather than putting them in the topic's pool one by one and taking them
// back one by one: the pool is fast for one record at a time, but slow for
// a batch's worth.
type batch struct {
	recs    []*Record
	offsets []int64
	free    []*Record // reclaimed, to be filled by the next call
}

// newRecord returns one of the batch's reclaimed records, or NewRecord's.
func (b *batch) newRecord(t *Topic) *Record {
	if n := len(b.free); n > 0 {
		rec := b.free[n-1]
		b.free[n-1] = nil
		b.free = b.free[:n-1]
		return rec
	}
	return t.NewRecord()
}

// newBatch returns a batch of n, from the topic's pool when it has one big
// enough: the log keeps the records, not the slices, so the next batch can
// reuse them. Give it back with releaseBatch.
func (t *Topic) newBatch(n int) *batch {
	if b, ok := t.batches.Get().(*batch); ok && cap(b.recs) >= n {
		b.recs, b.offsets = b.recs[:n], b.offsets[:n]
		return b
	}
	return &batch{recs: make([]*Record, n), offsets: make([]int64, n), free: make([]*Record, 0, n)}
}

// maxPooledBatch bounds the slices the pool keeps, so that one huge batch
// does not pin its buffer.
const maxPooledBatch = 4096

func (t *Topic) releaseBatch(b *batch) {
	if cap(b.recs) > maxPooledBatch {
		return
	}
	clear(b.recs)                   // the records now belong to the log
	for len(b.free) > cap(b.recs) { // more than the next call of this size needs
		t.free.Put(b.free[len(b.free)-1])
		b.free[len(b.free)-1] = nil
		b.free = b.free[:len(b.free)-1]
	}
	t.batches.Put(b)
}

// publishable fails a publish that cannot start: after Close began, or with
// ctx already done.
func (t *Topic) publishable(ctx context.Context) error {
	if t.broker.State() != Running {
		return ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return nil
}

// prepare routes rec, stamps it and names it, and copies its headers. A
// record too large for its partition's MaxBytes fails here, so a batch
// with one fails before anything is appended.
func (t *Topic) prepare(rec *Record, now time.Time) error {
	p := t.partitioner.Partition(rec.Key, len(t.parts))
	if p < 0 || p >= len(t.parts) {
		return fmt.Errorf("%w: partitioner chose partition %d of %d", ErrInvalid, p, len(t.parts))
	}
	part := t.parts[p]
	if part.ret.MaxBytes > 0 {
		if err := part.tooLarge(rec); err != nil {
			return err
		}
	}
	rec.Headers = maps.Clone(rec.Headers)
	rec.Created = now
	rec.log = part
	if t.broker.ids != nil {
		rec.id = t.broker.ids.NextID()
	}
	return nil
}

// Partition returns partition i, or nil when there is none.
func (t *Topic) Partition(i int) *Partition {
	if i < 0 || i >= len(t.parts) {
		return nil
	}
	return t.parts[i]
}

// Stats returns every partition's counters, by partition.
func (t *Topic) Stats() []PartitionStats {
	out := make([]PartitionStats, len(t.parts))
	for i, p := range t.parts {
		out[i] = p.Stats()
	}
	return out
}
