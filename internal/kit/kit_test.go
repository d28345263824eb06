package kit

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	"github.com/logbus/logbus/engine"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// A handler's panic becomes a *PanicError with the value and a stack; its
// error, or nil, comes back as it is, and a call costs no allocation.
func TestCallTurnsAPanicIntoAPanicError(t *testing.T) {
	boom := errors.New("boom")
	err := Call(context.Background(), func(context.Context, *engine.Delivery) error { panic(boom) }, &engine.Delivery{})
	pe, ok := errors.AsType[*engine.PanicError](err)
	if !ok || pe.Value != boom || len(pe.Stack) == 0 || !errors.Is(err, boom) {
		t.Errorf("Call of a panicking handler: %v, want a *PanicError of boom with a stack", err)
	}
	err = Call(context.Background(), func(context.Context, *engine.Batch) error { return boom }, &engine.Batch{})
	if err != boom {
		t.Errorf("Call of a failing batch handler: %v, want its error", err)
	}
	h := engine.Handler(func(context.Context, *engine.Delivery) error { return nil })
	d := &engine.Delivery{}
	if n := testing.AllocsPerRun(100, func() { _ = Call(context.Background(), h, d) }); n != 0 {
		t.Errorf("Call allocates %v times, want 0", n)
	}
}

// Outcome reads a batch handler's error: how many records from the
// first succeeded, and the error the next one failed with.
func TestOutcome(t *testing.T) {
	boom := errors.New("boom")
	named := &engine.BatchError{Index: 2}
	for _, tc := range []struct {
		name     string
		err      error
		wantDone int
		wantErr  error // nil: no failure; else errors.Is must hold
	}{
		{"nil acks every record", nil, 5, nil},
		{"a plain error fails the first record", boom, 0, boom},
		{"a BatchError acks the records before its index", &engine.BatchError{Index: 3, Err: boom}, 3, boom},
		{"a BatchError at index 0 acks none", &engine.BatchError{Index: 0, Err: boom}, 0, boom},
		{"a BatchError without Err fails with itself", named, 2, named},
		{"an index past the batch fails the first record as engine.ErrInvalid", &engine.BatchError{Index: 5, Err: boom}, 0, engine.ErrInvalid},
		{"a negative index fails the first record as engine.ErrInvalid", &engine.BatchError{Index: -1, Err: boom}, 0, engine.ErrInvalid},
		{"a wrapped BatchError is a plain error here: the typed layer unwraps it", errors.Join(boom, &engine.BatchError{Index: 3}), 0, boom},
	} {
		t.Run(tc.name, func(t *testing.T) {
			done, failed := Outcome(tc.err, 5)
			if done != tc.wantDone {
				t.Errorf("done: got %d, want %d", done, tc.wantDone)
			}
			switch {
			case tc.wantErr != engine.ErrInvalid && errors.Is(failed, engine.ErrInvalid):
				t.Errorf("failed: got %v, a valid BatchError taken for an invalid one", failed)
			case tc.wantErr == nil && failed != nil:
				t.Errorf("failed: got %v, want nil", failed)
			case tc.wantErr != nil && !errors.Is(failed, tc.wantErr):
				t.Errorf("failed: got %v, want an error wrapping %v", failed, tc.wantErr)
			}
		})
	}
}

func TestJudge(t *testing.T) {
	boom := errors.New("boom")
	for _, tc := range []struct {
		err     error
		attempt int
		want    Verdict
	}{
		{nil, 3, Ack},
		{boom, 1, Retry},
		{boom, 3, DeadLetter},
		{fmt.Errorf("bad: %w", engine.ErrPermanent), 1, DeadLetter},
		{&engine.DecodeError{Err: boom}, 1, DeadLetter},
		{&engine.PanicError{Value: 1}, 2, Retry},
		{engine.ErrNotDelivered, 3, NotDelivered},
		{fmt.Errorf("closed: %w", engine.ErrAbandoned), 3, Abandoned},
	} {
		if got := Judge(tc.err, tc.attempt, 3); got != tc.want {
			t.Errorf("Judge(%v, attempt %d, of 3) = %d, want %d", tc.err, tc.attempt, got, tc.want)
		}
	}
}

// The first Close runs the sequence with its own ctx; a later one whose
// ctx ends first returns that ctx's error, and the first goes on; one that
// waits long enough, and every one after, returns the first's result.
func TestCloserBoundsLaterCallersByTheirOwnContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var c Closer
		release := make(chan struct{})
		runs := 0
		want := errors.New("what the first Close left")
		first := make(chan error, 1)
		go func() {
			first <- c.Close(context.Background(), func() error { runs++; <-release; return want })
		}()
		synctest.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		start := time.Now()
		if err := c.Close(ctx, func() error { runs++; return nil }); !errors.Is(err, context.DeadlineExceeded) || time.Since(start) != time.Second {
			t.Errorf("second Close: %v after %v, want its ctx's DeadlineExceeded after 1s", err, time.Since(start))
		}
		waiting := make(chan error, 1)
		go func() { waiting <- c.Close(context.Background(), func() error { runs++; return nil }) }()
		synctest.Wait()
		close(release)
		for i, ch := range []chan error{first, waiting} {
			if err := <-ch; err != want {
				t.Errorf("Close %d: %v, want the first's result", i, err)
			}
		}
		if err := c.Close(context.Background(), func() error { runs++; return nil }); err != want || runs != 1 {
			t.Errorf("a Close after the first: %v with the sequence run %d times, want the first's result, run once", err, runs)
		}
	})
}

// AwaitWorkers hurries the handlers only once ctx ended, and then waits
// CloseGrace more.
func TestAwaitWorkers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		stopped := make(chan struct{})
		wait := func(ctx context.Context) error {
			select {
			case <-stopped:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		hurried := false
		close(stopped)
		if err := AwaitWorkers(context.Background(), wait, func() { hurried = true }); err != nil || hurried {
			t.Errorf("workers already stopped: %v, hurried %v; want nil, not hurried", err, hurried)
		}
		stopped = make(chan struct{})
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		start := time.Now()
		err := AwaitWorkers(ctx, wait, func() { hurried = true })
		if !errors.Is(err, context.DeadlineExceeded) || !hurried || time.Since(start) != time.Second+CloseGrace {
			t.Errorf("workers that do not stop: %v, hurried %v, after %v; want DeadlineExceeded, hurried, after 1s + CloseGrace", err, hurried, time.Since(start))
		}
	})
}

// probe is a Probe over a map the test writes.
type probe struct {
	mu   sync.Mutex
	now  map[string]Progress
	keys []string // the order to yield them in
}

func (p *probe) set(k string, pr Progress) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.now[k]; !ok {
		p.keys = append(p.keys, k)
	}
	p.now[k] = pr
}

func (p *probe) drop(k string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.now, k)
}

func (p *probe) Progress() iter.Seq2[string, Progress] {
	return func(yield func(string, Progress) bool) {
		p.mu.Lock()
		var ks []string
		var ps []Progress
		for _, k := range p.keys {
			if pr, ok := p.now[k]; ok {
				ks, ps = append(ks, k), append(ps, pr)
			}
		}
		p.mu.Unlock()
		for i := range ks {
			if !yield(ks[i], ps[i]) {
				return
			}
		}
	}
}

func (p *probe) Describe(k string, e *engine.Event) { e.Topic, e.Group = "t", k }

type events struct {
	mu  sync.Mutex
	got []engine.Event
}

func (o *events) Observe(e *engine.Event) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.got = append(o.got, *e)
}

func (o *events) take() []engine.Event {
	o.mu.Lock()
	defer o.mu.Unlock()
	got := o.got
	o.got = nil
	return got
}

// A delivery is reported stuck once, between one and one and a half
// thresholds after it began, and again when its progress moves on; a
// delivery that is not in flight, or moves on in time, is not; a
// partition no longer yielded is forgotten.
func TestWatchdogReportsAStuckDeliveryOnceAndItsEnd(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := &probe{now: map[string]Progress{}}
		obs := &events{}
		const after = 100 * time.Millisecond
		w := StartWatchdog(after, p, obs)
		defer w.Halt()
		p.set("stuck", Progress{Word: 1, InFlight: true, Attempt: 2})
		p.set("idle", Progress{Word: 7})
		p.set("quick", Progress{Word: 1, InFlight: true, Attempt: 1})
		start := time.Now()
		time.Sleep(after) // virtual: the threshold passes
		p.set("quick", Progress{Word: 2, InFlight: true, Attempt: 1})
		time.Sleep(after / 2)
		synctest.Wait()
		got := obs.take()
		if len(got) != 1 || got[0].Kind != engine.EventStuck || got[0].Group != "stuck" || got[0].Attempt != 2 || got[0].Topic != "t" {
			t.Fatalf("events after 1.5 thresholds: %+v, want one EventStuck of group stuck, attempt 2", got)
		}
		if d := got[0].Delay; d < after || d > time.Since(start) {
			t.Errorf("EventStuck.Delay %v, want at least %v and at most %v", d, after, time.Since(start))
		}
		if rf := w.RunningFor("stuck", Progress{Word: 1, InFlight: true, Attempt: 2}); rf != got[0].Delay {
			t.Errorf("RunningFor %v, want %v", rf, got[0].Delay)
		}
		if rf := w.RunningFor("stuck", Progress{Word: 2, InFlight: true, Attempt: 2}); rf != 0 {
			t.Errorf("RunningFor of a delivery no sample saw: %v, want 0", rf)
		}
		time.Sleep(3 * after)
		synctest.Wait()
		if got := obs.take(); len(got) != 1 || got[0].Group != "quick" || got[0].Kind != engine.EventStuck {
			t.Errorf("events while stuck stays stuck: %+v, want only quick's EventStuck, stuck's once was enough", got)
		}
		p.set("stuck", Progress{Word: 2})
		time.Sleep(after / 2)
		synctest.Wait()
		got = obs.take()
		if len(got) != 1 || got[0].Kind != engine.EventUnstuck || got[0].Group != "stuck" || got[0].Attempt != 2 {
			t.Fatalf("events once stuck moved on: %+v, want its EventUnstuck", got)
		}
		p.drop("quick")
		time.Sleep(after / 2)
		synctest.Wait()
		w.mu.Lock()
		_, kept := w.samples["quick"]
		w.mu.Unlock()
		if kept {
			t.Error("a partition no longer yielded is still sampled")
		}
		if got := obs.take(); len(got) != 0 {
			t.Errorf("events: %+v, want none", got)
		}
	})
}

// Wait waits out its delay unless stop or abort closes first.
func TestWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		if !Wait(time.Second, nil, nil) || time.Since(start) != time.Second {
			t.Errorf("Wait(1s) returned false or after %v", time.Since(start))
		}
		for name, chans := range map[string][2]chan struct{}{
			"stop":  {make(chan struct{}), nil},
			"abort": {nil, make(chan struct{})},
		} {
			start := time.Now()
			time.AfterFunc(time.Millisecond, func() {
				for _, ch := range chans {
					if ch != nil {
						close(ch)
					}
				}
			})
			if Wait(time.Hour, chans[0], chans[1]) || time.Since(start) != time.Millisecond {
				t.Errorf("Wait(1h) with %s closed after 1ms: true, or returned after %v", name, time.Since(start))
			}
		}
	})
}
