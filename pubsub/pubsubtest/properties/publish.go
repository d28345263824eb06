package properties

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"pgregory.net/rapid"

	"github.com/logbus/logbus/pubsub"
)

func (m *machine) drawJob(t *rapid.T) job {
	m.nextSeq++
	j := job{Seq: m.nextSeq}
	j.Fault = rapid.SampledFrom([]fault{
		faultNone, faultNone, faultNone, faultNone, faultNone, faultNone,
		faultTransient, faultTransient, faultPermanent, faultPanic, faultUndecodable,
	}).Draw(t, "fault")
	if j.Fault == faultTransient {
		j.K = rapid.IntRange(1, 4).Draw(t, "failures")
	}
	j.Sleep = rapid.SampledFrom([]int{0, 0, 0, 0, 0, 0, 0, 0, 10, 30}).Draw(t, "sleep")
	return j
}

// Publish publishes one record and checks where it landed. Under DropOldest
// without age retention the model predicts exactly whether the publish
// evicts a record.
func (m *machine) Publish(t *rapid.T) {
	j := m.drawJob(t)
	key := rapid.SampledFrom(append([]string{""}, m.keys...)).Draw(t, "key")
	before := m.topic.Stats()
	wantDrop := m.predictDrop(key)
	now := time.Now() // the record's Created: nothing in the bubble moves time before Publish reads the clock
	pos, err := m.publish(key, j)
	m.recordPublish(t, []publishResult{{key: key, job: j, pos: pos, err: err, created: now}})
	if wantDrop >= 0 && err == nil {
		if got := m.topic.Stats().Dropped - before.Dropped; got != int64(wantDrop) {
			t.Fatalf("accounting: publishing seq %d to partition %d dropped %d records, the model predicts %d",
				j.Seq, pos.Partition, got, wantDrop)
		}
	}
}

// PublishBurst publishes from several goroutines at once.
func (m *machine) PublishBurst(t *rapid.T) {
	producers := rapid.IntRange(2, 4).Draw(t, "producers")
	per := rapid.IntRange(1, 5).Draw(t, "perProducer")
	type plan struct {
		key string
		job job
	}
	plans := make([][]plan, producers)
	for p := range plans {
		for range per {
			key := rapid.SampledFrom(append([]string{""}, m.keys...)).Draw(t, "key")
			plans[p] = append(plans[p], plan{key, m.drawJob(t)})
		}
	}
	results := make([][]publishResult, producers)
	var wg sync.WaitGroup
	for p := range plans {
		wg.Go(func() {
			for _, pl := range plans[p] {
				now := time.Now() // a blocked publish before this one moved time on
				pos, err := m.publish(pl.key, pl.job)
				results[p] = append(results[p], publishResult{key: pl.key, job: pl.job, pos: pos, err: err, created: now})
			}
		})
	}
	wg.Wait()
	m.recordPublish(t, slices.Concat(results...))
}

type publishResult struct {
	key     string
	job     job
	pos     pubsub.Position
	err     error
	created time.Time
	// unattempted marks the entries of a batch after the one that failed:
	// not published, and not a failed publish of their own.
	unattempted bool
}

// PublishBatch publishes a batch in one call: keyed entries with
// PublishBatch, or keyless ones with PublishValues. The positions it
// returns are checked like single publishes' (density, routing); the
// entries after a failure are not in the log. A batch reads the clock
// once: its records share one Created.
func (m *machine) PublishBatch(t *rapid.T) {
	size := rapid.IntRange(1, 8).Draw(t, "batchSize")
	keyless := rapid.Bool().Draw(t, "keyless")
	var entries []pubsub.Entry[string, job]
	for range size {
		e := pubsub.Entry[string, job]{Value: m.drawJob(t)}
		if !keyless {
			e.Key = rapid.SampledFrom(m.keys).Draw(t, "key")
		}
		entries = append(entries, e)
	}
	var positions []pubsub.Position
	var err error
	now := time.Now()
	if keyless {
		values := make([]job, len(entries))
		for i, e := range entries {
			values[i] = e.Value
		}
		positions, err = m.topic.PublishValues(context.Background(), values)
	} else {
		positions, err = m.topic.PublishBatch(context.Background(), entries)
	}
	if len(positions) > len(entries) || (err == nil) != (len(positions) == len(entries)) {
		t.Fatalf("PublishBatch of %d: got %d positions and error %v", len(entries), len(positions), err)
	}
	results := make([]publishResult, len(entries))
	for i, e := range entries {
		results[i] = publishResult{key: e.Key, job: e.Value, created: now}
		switch {
		case i < len(positions):
			results[i].pos = positions[i]
		case i == len(positions):
			results[i].err = err
		default:
			results[i].err, results[i].unattempted = err, true
		}
	}
	m.recordPublish(t, results)
}

// PublishAsync publishes a run of records with PublishAsync (and
// PublishValueAsync for keyless ones) from one goroutine, then Flushes,
// and checks against the model: every Pending resolves exactly once (Done
// closed, Wait the same twice); the records of a partition that were
// stored got increasing offsets in call order (density is recordPublish's);
// in a partition, a record issued while an earlier one that failed was
// still unresolved is not stored (the prefix rule); the first failure of
// a partition carries its own cause (ErrBackpressure), not ErrAborted;
// and Flush says how many failed and wraps the first.
func (m *machine) PublishAsync(t *rapid.T) {
	n := rapid.IntRange(1, 8).Draw(t, "asyncRun")
	type item struct {
		key     string
		job     job
		pd      *pubsub.Pending
		created time.Time
		// open lists the earlier items still unresolved when this one was
		// issued.
		open []int
	}
	ctx := context.Background()
	items := make([]item, n)
	for i := range items {
		it := &items[i]
		it.key = rapid.SampledFrom(append([]string{""}, m.keys...)).Draw(t, "key")
		it.job = m.drawJob(t)
		for k := range i {
			select {
			case <-items[k].pd.Done():
			default:
				it.open = append(it.open, k)
			}
		}
		it.created = time.Now() // as for Publish: nothing moves time before the engine reads the clock
		if it.key == "" {
			it.pd = m.topic.PublishValueAsync(ctx, it.job)
		} else {
			it.pd = m.topic.PublishAsync(ctx, it.key, it.job)
		}
	}
	flushErr := m.topic.Flush(ctx)
	var results []publishResult
	var failures int
	var firstErr error
	firstFailure := map[int]int{} // partition -> the item that failed first in it (keyed items only)
	lastOffset := map[int]int64{}
	for i, it := range items {
		select {
		case <-it.pd.Done():
		default:
			t.Fatalf("async: seq %d unresolved after Flush", it.job.Seq)
		}
		pos, err := it.pd.Wait(ctx)
		if pos2, err2 := it.pd.Wait(ctx); pos2 != pos || err2 != err {
			t.Fatalf("async: seq %d resolved as %v, %v, then as %v, %v", it.job.Seq, pos, err, pos2, err2)
		}
		p := -1
		if it.key != "" {
			p = pubsub.KeyHash().Partition([]byte(it.key), m.partitions)
		}
		r := publishResult{key: it.key, job: it.job, pos: pos, err: err, created: it.created}
		if err != nil {
			failures++
			if firstErr == nil {
				firstErr = err
			}
			if p >= 0 {
				if _, ok := firstFailure[p]; !ok {
					firstFailure[p] = i
					if errors.Is(err, pubsub.ErrAborted) {
						t.Fatalf("async: seq %d, the first of partition %d to fail, failed with ErrAborted: %v", it.job.Seq, p, err)
					}
				}
			}
			// An aborted record never waited for room: it is not one of the
			// topic's TimedOut publishes.
			r.unattempted = errors.Is(err, pubsub.ErrAborted)
			results = append(results, r)
			continue
		}
		if last, ok := lastOffset[pos.Partition]; ok && pos.Offset <= last {
			t.Fatalf("async: seq %d stored at %v, before an earlier record of its partition (offset %d): not call order", it.job.Seq, pos, last)
		}
		lastOffset[pos.Partition] = pos.Offset
		if f, ok := firstFailure[pos.Partition]; ok && slices.Contains(it.open, f) {
			t.Fatalf("async: seq %d stored at %v although seq %d of its partition failed and was unresolved when it was issued: not a prefix",
				it.job.Seq, pos, items[f].job.Seq)
		}
		results = append(results, r)
	}
	switch {
	case failures == 0 && flushErr != nil:
		t.Fatalf("async: Flush returned %v, but every record was stored", flushErr)
	case failures > 0 && (flushErr == nil || !errors.Is(flushErr, firstErr) && !errors.Is(flushErr, errors.Unwrap(firstErr)) ||
		!strings.Contains(flushErr.Error(), fmt.Sprint(failures))):
		t.Fatalf("async: %d records failed, the first with %v; Flush returned %v", failures, firstErr, flushErr)
	}
	m.recordPublish(t, results)
}

func (m *machine) publish(key string, j job) (pubsub.Position, error) {
	if key == "" {
		return m.topic.PublishValue(context.Background(), j)
	}
	return m.topic.Publish(context.Background(), key, j)
}

// predictDrop returns 1 when publishing to key's partition must evict a
// record, 0 when it must not, and -1 when the model cannot tell (keyless
// records, Block, age retention).
func (m *machine) predictDrop(key string) int {
	if key == "" || m.retention.OnFull != pubsub.DropOldest || m.retention.MaxAge != 0 {
		return -1
	}
	p := pubsub.KeyHash().Partition([]byte(key), m.partitions)
	earliest, end, _ := m.topic.Offsets(p)
	if end-earliest < int64(m.retention.MaxMessages) {
		return 0
	}
	if len(m.groups) == 0 {
		return 1 // nothing is reclaimed while no group is subscribed: it is dropped
	}
	low := end
	for _, g := range m.groups {
		low = min(low, g.Committed(p))
	}
	if low > earliest {
		return 0 // reclaim frees room
	}
	return 1
}

// recordPublish folds publish results into the model and checks offset
// uniqueness and density (invariant 1): the successful publishes to a
// partition take exactly the offsets after its previous end, each once.
func (m *machine) recordPublish(t *rapid.T, results []publishResult) {
	ends := map[int]int64{}
	for _, p := range m.bySeq {
		ends[p.partition] = max(ends[p.partition], p.offset+1)
	}
	got := map[int][]int64{}
	for _, r := range results {
		if r.err != nil {
			if !errors.Is(r.err, pubsub.ErrBackpressure) {
				t.Fatalf("publish seq %d: unexpected error %v", r.job.Seq, r.err)
			}
			if !r.unattempted {
				m.backpressured++
			}
			m.failedSeq[r.job.Seq] = r.err
			continue
		}
		if prev, ok := m.byPos[r.pos]; ok {
			t.Fatalf("offsets: seq %d and seq %d both landed at %+v", prev, r.job.Seq, r.pos)
		}
		if r.key != "" {
			if want := pubsub.KeyHash().Partition([]byte(r.key), m.partitions); r.pos.Partition != want {
				t.Fatalf("routing: key %q went to partition %d, want %d", r.key, r.pos.Partition, want)
			}
		}
		m.byPos[r.pos] = r.job.Seq
		m.bySeq[r.job.Seq] = published{job: r.job, key: r.key, partition: r.pos.Partition, offset: r.pos.Offset, created: r.created}
		got[r.pos.Partition] = append(got[r.pos.Partition], r.pos.Offset)
	}
	for p, offs := range got {
		slices.Sort(offs)
		for i, off := range offs {
			if want := ends[p] + int64(i); off != want {
				t.Fatalf("offsets: partition %d handed out %v after end %d: not dense", p, offs, ends[p])
			}
		}
		if _, end, _ := m.topic.Offsets(p); end != ends[p]+int64(len(offs)) {
			t.Fatalf("offsets: partition %d ends at %d, model says %d", p, end, ends[p]+int64(len(offs)))
		}
	}
}
