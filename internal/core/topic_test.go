package core

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// A batch that fills a partition whose group has committed everything
// reclaims the oldest records, and NewRecords hands them out again,
// emptied, to the next batch: a steady batch publisher allocates no
// records. The free list is a sync.Pool, which may drop what it holds (on
// a GC, and at random under the race detector), so the test asks only that
// reuse happens within a few rounds, and checks every record handed out.
func TestNewRecordsHandsOutWhatABatchReclaimed(t *testing.T) {
	b := newBroker(t, Config{})
	orders := mustTopic(t, b, "orders", TopicSpec{Retention: Retention{MaxMessages: 8}})
	subscribe(t, b, "orders", "billing", "b1", func(context.Context, *Delivery) error { return nil })
	ctx := context.Background()
	published := map[*Record]bool{}
	reused := 0
	for round := 0; round < 200 && reused < 20; round++ {
		// Fewer records than the free list holds, then more: NewRecords
		// stops at whichever runs out first.
		for _, size := range []int{3, 8, 5} {
			recs := make([]*Record, size)
			orders.NewRecords(recs)
			distinct := map[*Record]bool{}
			for i, rec := range recs {
				switch {
				case rec == nil:
					t.Fatalf("round %d: NewRecords left record %d of %d nil", round, i, size)
				case len(rec.Key) != 0 || len(rec.Value) != 0 || rec.Headers != nil || rec.Offset != 0:
					t.Fatalf("round %d: record %d handed out not empty: %+v", round, i, rec)
				case distinct[rec]:
					t.Fatalf("round %d: record %d handed out twice in one batch", round, i)
				}
				distinct[rec] = true
				if published[rec] {
					reused++
				}
				rec.Value = append(rec.Value, strconv.Itoa(i)...)
			}
			if n, err := orders.AppendBatch(ctx, make([]int, size), recs, make([]int64, size)); n != size || err != nil {
				t.Fatalf("AppendBatch of %d: %d, %v", size, n, err)
			}
			for _, rec := range recs {
				published[rec] = true
			}
			drain(t, b)
		}
	}
	if reused == 0 {
		t.Fatalf("no reclaimed record was handed out again over %d records", len(published))
	}
}

// A batch that stops part way, at a partition that stays full, says how
// many of its records were stored: those of the runs before, and those of
// the run that stopped that fitted.
func TestAppendBatchCountsWhatItStoredBeforeItStopped(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, Config{})
		orders := mustTopic(t, b, "orders", TopicSpec{Partitions: 2,
			Retention: Retention{MaxMessages: 4, BlockTimeout: time.Second}})
		g := subscribe(t, b, "orders", "billing", "b1", func(context.Context, *Delivery) error { return nil })
		mustPause(t, g) // nothing is committed: partition 1 stays full once it is
		for range 3 {
			publishTo(t, orders, 1)
		}
		// Two records for partition 0, then three for partition 1, which
		// has room for one.
		partitions := []int{0, 0, 1, 1, 1}
		recs := make([]*Record, len(partitions))
		for i := range recs {
			recs[i] = orders.NewRecord()
			recs[i].Value = []byte{byte(i)}
		}
		offsets := make([]int64, len(recs))
		n, err := orders.AppendBatch(context.Background(), partitions, recs, offsets)
		wantErr(t, err, ErrBackpressure)
		if n != 3 || offsets[2] != 3 {
			t.Fatalf("AppendBatch stored %d (offsets %v), want 3: two on partition 0, one at offset 3 of partition 1", n, offsets)
		}
		if st := orders.Stats(); st[0].Retained != 2 || st[1].Retained != 4 {
			t.Fatalf("retained %d and %d, want 2 and 4", st[0].Retained, st[1].Retained)
		}
	})
}

// Every run of a batch is stored, each on its partition.
func TestAppendBatchStoresEveryRun(t *testing.T) {
	b := newBroker(t, Config{})
	orders := mustTopic(t, b, "orders", TopicSpec{Partitions: 3})
	partitions := []int{2, 0, 0, 1, 2, 2}
	recs := make([]*Record, len(partitions))
	orders.NewRecords(recs)
	offsets := make([]int64, len(recs))
	if n, err := orders.AppendBatch(context.Background(), partitions, recs, offsets); n != len(recs) || err != nil {
		t.Fatalf("AppendBatch: %d, %v; want all %d", n, err, len(recs))
	}
	if want := []int64{0, 0, 1, 0, 1, 2}; fmt.Sprint(offsets) != fmt.Sprint(want) {
		t.Errorf("offsets %v, want %v", offsets, want)
	}
	if st := orders.Stats(); st[0].Retained != 2 || st[1].Retained != 1 || st[2].Retained != 3 {
		t.Errorf("retained %d, %d, %d; want 2, 1, 3", st[0].Retained, st[1].Retained, st[2].Retained)
	}
}

// RecordID names a stored record as its deliveries do, and is "" for a
// position that holds none: a negative offset, one not yet written, one
// trimmed, a partition that is not.
func TestRecordID(t *testing.T) {
	var next atomic.Int64
	custom := idFunc(func() string { return "id-" + strconv.FormatInt(next.Add(1), 10) })
	for _, tc := range []struct {
		name string
		cfg  Config
		want func(offset int64) string // the ID of the record at offset 2..5
	}{
		{"named by position", Config{}, nil},
		{"named by an IDSource", Config{IDs: custom}, func(offset int64) string { return "id-" + strconv.FormatInt(offset+1, 10) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBroker(t, tc.cfg)
			orders := mustTopic(t, b, "orders", TopicSpec{Partitions: 2,
				Retention: Retention{MaxMessages: 4, OnFull: DropOldest}})
			delivered := map[int64]string{}
			handled := make(chan struct{})
			subscribe(t, b, "orders", "billing", "b1", func(_ context.Context, d *Delivery) error {
				delivered[d.Record.Offset] = d.ID
				handled <- struct{}{}
				return nil
			})
			for range 6 {
				publishTo(t, orders, 0) // offsets 0..5; DropOldest keeps 2..5
				<-handled
			}
			first := int64(2) // DropOldest kept 2..5; IDs by position are known for every offset
			if tc.want == nil {
				first = 0
			}
			for offset := first; offset < 6; offset++ {
				got := orders.RecordID(0, offset)
				if got == "" || got != delivered[offset] {
					t.Errorf("RecordID(0, %d) = %q, want the delivery's %q", offset, got, delivered[offset])
				}
				if tc.want != nil && got != tc.want(offset) {
					t.Errorf("RecordID(0, %d) = %q, want %q", offset, got, tc.want(offset))
				}
			}
			if tc.want != nil {
				// Only the record names an ID it was given: once trimmed, or
				// before it is written, there is none.
				for _, offset := range []int64{1, 6} {
					if got := orders.RecordID(0, offset); got != "" {
						t.Errorf("RecordID(0, %d) = %q, want \"\" (not retained)", offset, got)
					}
				}
			}
			for _, at := range []struct {
				partition int
				offset    int64
			}{{0, -1}, {-1, 2}, {2, 2}} {
				if got := orders.RecordID(at.partition, at.offset); got != "" {
					t.Errorf("RecordID(%d, %d) = %q, want \"\"", at.partition, at.offset, got)
				}
			}
		})
	}
}

// idFunc is an IDSource from a function.
type idFunc func() string

func (f idFunc) NextID() string { return f() }

// publishTo appends an empty record to partition p.
func publishTo(t *testing.T, topic *Topic, p int) int64 {
	t.Helper()
	offset, err := topic.AppendOne(context.Background(), p, topic.NewRecord())
	if err != nil {
		t.Fatalf("AppendOne(%d): %v", p, err)
	}
	return offset
}

// A partition that retains very few records still names each of them,
// whatever its window of IDs holds.
func TestRecordIDsOfATinyWindow(t *testing.T) {
	for _, retained := range []int{1, 2, idBlockLen, idBlockLen + 1} {
		t.Run(strconv.Itoa(retained), func(t *testing.T) {
			ids := newRecordIDs("p", 1, 0, retained)
			for _, offset := range []int64{0, 1, idBlockLen - 1, idBlockLen, 5 * idBlockLen, 3} {
				if got, want := ids.id(offset), "p-1-0-"+strconv.FormatInt(offset, 10); got != want {
					t.Errorf("id(%d) = %q, want %q", offset, got, want)
				}
			}
			got := make([]string, 3)
			ids.fill(idBlockLen-1, got)
			for i, id := range got {
				if want := "p-1-0-" + strconv.Itoa(idBlockLen-1+i); id != want {
					t.Errorf("fill: ID %d is %q, want %q", i, id, want)
				}
			}
		})
	}
}

// A topic with MaxBytes stamps and names every record of a batch as any
// other topic does.
func TestABatchUnderMaxBytesIsStampedAndNamed(t *testing.T) {
	clock := &manualClock{now: time.Date(2026, 12, 3, 9, 0, 0, 0, time.UTC)}
	var next atomic.Int64
	b := newBroker(t, Config{Clock: clock, IDs: idFunc(func() string { return "id-" + strconv.FormatInt(next.Add(1), 10) })})
	orders := mustTopic(t, b, "orders", TopicSpec{Partitions: 2, Retention: Retention{MaxBytes: 1 << 10}})
	recs := make([]*Record, 3)
	orders.NewRecords(recs)
	if n, err := orders.AppendBatch(context.Background(), []int{0, 1, 1}, recs, make([]int64, 3)); n != 3 || err != nil {
		t.Fatalf("AppendBatch: %d, %v", n, err)
	}
	for i, rec := range recs {
		if want := "id-" + strconv.Itoa(i+1); !rec.Created.Equal(clock.Now()) || rec.ID != want {
			t.Errorf("record %d: created %v, ID %q; want %v and %q", i, rec.Created, rec.ID, clock.Now(), want)
		}
	}
}
