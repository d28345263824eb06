package core

import (
	"context"
	"fmt"
	"sync"
)

// Topic is a named, fixed set of partitions. Which partition a record goes
// to is the caller's choice (the typed layer routes).
type Topic struct {
	name   string
	broker *Broker
	parts  []*Partition
	free   sync.Pool // of *Record: reclaimed records, for NewRecord to reuse
}

func newTopic(b *Broker, name string, spec TopicSpec) (*Topic, error) {
	spec, err := spec.Resolve(name)
	if err != nil {
		return nil, err
	}
	ret := spec.Retention
	t := &Topic{name: name, broker: b, parts: make([]*Partition, 0, spec.Partitions)}
	seq := int(b.topicSeq.Add(1))
	for i := range spec.Partitions {
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
// Headers) and give to Append. It may be a record the topic reclaimed:
// then its Key and Value are empty slices over that record's buffers (at
// most maxReusedBuffer bytes each), which the caller may append to instead
// of allocating. Whoever does must be sure that nothing made from the
// earlier record still refers to those bytes: appending is safe only for a
// topic whose readers copy what they take from a record.
func (t *Topic) NewRecord() *Record {
	if rec, ok := t.free.Get().(*Record); ok {
		return rec
	}
	return new(Record)
}

// Append stores recs, filled by the caller, at the end of partition, in
// order, and puts the offset of recs[i] in offsets[i]. It stamps each with
// the clock (one reading for all of them) and names it with the broker's
// IDSource, if any, and takes ownership of it and its key, value and
// headers. It returns how many it stored: all of them, or, with an error,
// the first ones.
//
// It blocks only when the partition is full under Block (see
// Partition.Append). A done ctx fails it before anything is stored, and so
// does a record larger than the partition's MaxBytes.
func (t *Topic) Append(ctx context.Context, partition int, recs []*Record, offsets []int64) (int, error) {
	part, err := t.appendable(ctx, partition, recs)
	if err != nil {
		return 0, err
	}
	return part.Append(ctx, recs, offsets)
}

// AppendOne is Append of one record: it returns the record's offset.
func (t *Topic) AppendOne(ctx context.Context, partition int, rec *Record) (int64, error) {
	recs := [1]*Record{rec}
	part, err := t.appendable(ctx, partition, recs[:])
	if err != nil {
		return 0, err
	}
	var offset [1]int64
	if _, err := part.Append(ctx, recs[:], offset[:]); err != nil {
		return 0, err
	}
	return offset[0], nil
}

// appendable checks that recs may be appended to partition and stamps and
// names them; it returns the partition.
func (t *Topic) appendable(ctx context.Context, partition int, recs []*Record) (*Partition, error) {
	if partition < 0 || partition >= len(t.parts) {
		return nil, fmt.Errorf("%w: no partition %d of %d", ErrInvalid, partition, len(t.parts))
	}
	if t.broker.State() != Running {
		return nil, ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	part := t.parts[partition]
	if part.ret.MaxBytes > 0 {
		for _, rec := range recs {
			if err := part.tooLarge(rec); err != nil {
				return nil, err
			}
		}
	}
	now := t.broker.clock.Now()
	for _, rec := range recs {
		rec.Created = now
		if t.broker.ids != nil {
			rec.ID = t.broker.ids.NextID()
		}
	}
	return part, nil
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
