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

// Topic is a named, fixed set of partitions and the rule that routes records
// to them.
type Topic struct {
	name        string
	broker      *Broker
	parts       []*Partition
	partitioner Partitioner
	batches     sync.Pool // of *[]Record: see batchRecords
}

func newTopic(b *Broker, name string, cfg TopicConfig) (*Topic, error) {
	if name == "" {
		return nil, fmt.Errorf("%w: empty topic name", ErrInvalid)
	}
	if cfg.Partitions < 0 {
		return nil, fmt.Errorf("%w: topic %q: %d partitions", ErrInvalid, name, cfg.Partitions)
	}
	if cfg.Partitions == 0 {
		cfg.Partitions = 1
	}
	ret, err := cfg.Retention.Resolve()
	if err != nil {
		return nil, fmt.Errorf("topic %q: %w", name, err)
	}
	if cfg.Partitioner == nil {
		cfg.Partitioner = KeyHash()
	}
	t := &Topic{name: name, broker: b, partitioner: cfg.Partitioner}
	seq := int(b.topicSeq.Add(1))
	for i := range cfg.Partitions {
		part := newPartition(name, i, ret, b.clock)
		if b.ids == nil {
			part.ids = newRecordIDs(b.idPrefix, seq, i)
		}
		t.parts = append(t.parts, part)
	}
	return t, nil
}

// Name returns the topic's name.
func (t *Topic) Name() string { return t.name }

// Partitions returns the number of partitions.
func (t *Topic) Partitions() int { return len(t.parts) }

// Publish appends a record to the partition its key routes to and returns
// where it landed. It takes ownership of key and value: the caller must not
// modify them afterwards. headers are copied.
//
// It blocks only when the partition is full under Block (see
// Partition.Append). A done ctx fails the publish before anything is stored.
func (t *Topic) Publish(ctx context.Context, key, value []byte, headers map[string]string) (Position, error) {
	if err := t.publishable(ctx); err != nil {
		return Position{}, err
	}
	var rec [1]Record // Append copies it into the log and sets its Offset
	if err := t.prepare(&rec[0], Entry{Key: key, Value: value, Headers: headers}, t.broker.clock.Now()); err != nil {
		return Position{}, err
	}
	part := rec[0].log
	if _, err := part.Append(ctx, rec[:]...); err != nil {
		return Position{}, err
	}
	return Position{Partition: part.index, Offset: rec[0].Offset}, nil
}

// Entry is one record of a batch given to PublishBatch.
type Entry struct {
	Key     []byte // nil for a keyless record
	Value   []byte
	Headers map[string]string
}

// PublishBatch appends n records in order, each to the partition its key
// routes to, as Publish would one by one, and returns how many it appended:
// all of them, or, with an error, the first ones. entry(i) gives the i-th
// record; PublishBatch takes ownership of its key and value, and copies its
// headers. landed, if not nil, is told where each appended record landed.
//
// Every entry is taken, and routed, before anything is appended: an error
// from entry (returned as it is) or a partitioner that chooses no valid
// partition fails the batch with nothing appended.
//
// A batch costs much less than its records published one by one: the clock
// is read once (every record of the batch has the same Created), and each
// run of consecutive records for one partition is appended under one lock,
// with one wake-up for its readers. Records of one partition keep their
// batch order; another producer's records may land between two runs. Under
// Block the call waits for room as often as needed, each record at most
// BlockTimeout.
func (t *Topic) PublishBatch(ctx context.Context, n int, entry func(i int) (Entry, error), landed func(i int, pos Position)) (int, error) {
	if err := t.publishable(ctx); err != nil {
		return 0, err
	}
	now := t.broker.clock.Now()
	buf := t.batchRecords(n)
	defer t.releaseBatchRecords(buf)
	recs := *buf
	for i := range recs {
		e, err := entry(i)
		if err != nil {
			return 0, err
		}
		if err := t.prepare(&recs[i], e, now); err != nil {
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
		stored, err := part.Append(ctx, recs[appended:run]...)
		if landed != nil {
			for i := appended; i < appended+stored; i++ {
				landed(i, Position{Partition: part.index, Offset: recs[i].Offset})
			}
		}
		appended += stored
		if err != nil {
			return appended, err
		}
	}
	return appended, nil
}

// batchRecords returns a slice of n records to prepare a batch in, from the
// topic's pool when it has one big enough: Append copies the records into
// the log, so the next batch can reuse the slice. Give it back with
// releaseBatchRecords.
func (t *Topic) batchRecords(n int) *[]Record {
	if b, ok := t.batches.Get().(*[]Record); ok && cap(*b) >= n {
		*b = (*b)[:n]
		return b
	}
	b := make([]Record, n)
	return &b
}

// maxPooledBatch bounds the slices the pool keeps, so that one huge batch
// does not pin its buffer.
const maxPooledBatch = 4096

func (t *Topic) releaseBatchRecords(b *[]Record) {
	if cap(*b) > maxPooledBatch {
		return
	}
	clear(*b) // the keys and values now belong to the log
	t.batches.Put(b)
}

// publishable fails a publish that cannot start: after Close began, or with
// ctx already done.
func (t *Topic) publishable(ctx context.Context) error {
	if t.broker.State() != Running {
		return fmt.Errorf("%w: publish to topic %q", ErrClosed, t.name)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("publish to topic %q: %w", t.name, err)
	}
	return nil
}

// prepare fills rec from e: routes it, stamps it and names it.
func (t *Topic) prepare(rec *Record, e Entry, now time.Time) error {
	p := t.partitioner.Partition(e.Key, len(t.parts))
	if p < 0 || p >= len(t.parts) {
		return fmt.Errorf("%w: topic %q: partitioner chose partition %d of %d", ErrInvalid, t.name, p, len(t.parts))
	}
	*rec = Record{
		Key:     e.Key,
		Value:   e.Value,
		Headers: maps.Clone(e.Headers),
		Created: now,
		log:     t.parts[p],
	}
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
