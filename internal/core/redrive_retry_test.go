package core

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// redriveRig is a group on one partition whose handler fails each value as
// often as fails says (counted over every delivery of the value), and
// records the attempts it saw per value.
type redriveRig struct {
	b     *Broker
	topic *Topic
	g     *Group

	mu       sync.Mutex
	fails    map[string]int
	attempts map[string][]int
}

func newRedriveRig(t *testing.T, retry RetryPolicy, fails map[string]int) *redriveRig {
	r := &redriveRig{fails: fails, attempts: map[string][]int{}}
	r.b = newBroker(t, Config{Retry: retry})
	r.topic = mustTopic(t, r.b, "orders", TopicSpec{})
	r.g = subscribe(t, r.b, "orders", "billing", "b1", func(_ context.Context, d *Delivery) error {
		r.mu.Lock()
		defer r.mu.Unlock()
		v := string(d.Record.Value)
		r.attempts[v] = append(r.attempts[v], d.Attempt)
		if r.fails[v] > 0 {
			r.fails[v]--
			return errors.New("boom")
		}
		return nil
	})
	return r
}

func (r *redriveRig) seen(v string) []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.attempts[v])
}

// A redriven letter that fails again is retried from attempt 1 up to the
// group's MaxAttempts, and dead-lettered again after the last.
func TestARedrivenLetterIsRetriedUpToMaxAttempts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// recovers fails its three attempts and two more after the redrive;
		// poison fails every time.
		r := newRedriveRig(t, RetryPolicy{MaxAttempts: 3, BaseDelay: time.Second},
			map[string]int{"recovers": 5, "poison": 100})
		for _, v := range []string{"recovers", "poison"} {
			publish(t, r.topic, "", v)
		}
		drain(t, r.b)
		if n := len(r.g.DeadLetters()); n != 2 {
			t.Fatalf("%d dead letters, want both values", n)
		}
		if n, err := r.g.Redrive(context.Background(), nil); n != 2 || err != nil {
			t.Fatalf("Redrive: %d, %v", n, err)
		}
		drain(t, r.b)
		// Three attempts before the redrive, and three after it.
		if got := r.seen("recovers"); !slices.Equal(got, []int{1, 2, 3, 1, 2, 3}) {
			t.Errorf("recovers: attempts %v, want 1 2 3 then 1 2 3 after the redrive (acked at the last)", got)
		}
		if got := r.seen("poison"); !slices.Equal(got, []int{1, 2, 3, 1, 2, 3}) {
			t.Errorf("poison: attempts %v, want 1 2 3 then 1 2 3 after the redrive", got)
		}
		letters := r.g.DeadLetters()
		if len(letters) != 1 || string(letters[0].Record.Value) != "poison" || letters[0].Attempts != 3 {
			t.Fatalf("dead letters %+v, want poison alone, after 3 attempts", letters)
		}
	})
}

// A redriven letter's attempts survive its worker: paused during its
// backoff and resumed, it goes on from the attempt it was at.
func TestARedrivenLetterKeepsItsAttemptsAcrossAPause(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRedriveRig(t, RetryPolicy{MaxAttempts: 3, BaseDelay: time.Second},
			map[string]int{"flaky": 4})
		publish(t, r.topic, "", "flaky")
		drain(t, r.b) // dead-lettered after 3 attempts
		if n, err := r.g.Redrive(context.Background(), nil); n != 1 || err != nil {
			t.Fatalf("Redrive: %d, %v", n, err)
		}
		synctest.Wait() // its first attempt after the redrive failed; the worker waits out the backoff
		mustPause(t, r.g)
		if err := r.g.Resume(context.Background()); err != nil {
			t.Fatal(err)
		}
		drain(t, r.b)
		if got := r.seen("flaky"); !slices.Equal(got, []int{1, 2, 3, 1, 2}) {
			t.Errorf("attempts %v, want 1 2 3, then 1 and (after the pause) 2", got)
		}
		if n := len(r.g.DeadLetters()); n != 0 {
			t.Errorf("%d dead letters, want none", n)
		}
	})
}
