// Command keyconcurrency shows WithKeyConcurrency: a group whose handler
// waits on I/O (here a payment service that takes 10ms a call) serves many
// customers of one partition at once, while each customer's payments stay
// in order, and a customer whose payment fails and waits out its retry
// holds back only its own payments.
//
// Run it with go run ./examples/keyconcurrency; examples/examples_test.go
// checks its output.
package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/pubsub"
)

var customers = []string{"alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi"}

// payments counts what the handler saw: how many calls ran at once, and
// each customer's payments in the order they went through.
type payments struct {
	mu      sync.Mutex
	running int
	peak    int
	paid    map[string][]string
	order   []string // every payment, in the order they went through
	fail    func(pubsub.Message[string]) bool
}

// pay is the handler: a call to the payment service, which takes 10ms.
func (p *payments) pay(ctx context.Context, msg pubsub.Message[string]) error {
	p.mu.Lock()
	p.running++
	p.peak = max(p.peak, p.running)
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.running--
		p.mu.Unlock()
	}()
	select {
	case <-time.After(10 * time.Millisecond): // the payment service's answer
	case <-ctx.Done():
		return ctx.Err()
	}
	if p.fail != nil && p.fail(msg) {
		return errors.New("payment service: try again")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	customer := string(msg.Key)
	p.paid[customer] = append(p.paid[customer], msg.Value)
	p.order = append(p.order, msg.Value)
	return nil
}

// inOrder reports whether every customer's payments went through in the
// order they were published.
func (p *payments) inOrder() bool {
	for _, c := range customers {
		for i, v := range p.paid[c] {
			if v != fmt.Sprintf("%s-%d", c, i+1) {
				return false
			}
		}
	}
	return true
}

// run publishes five payments for each customer into one partition, then
// lets the group "payments" handle them with key concurrency n, and
// returns what it saw and how long it took.
func run(n int, fail func(pubsub.Message[string]) bool) (*payments, time.Duration) {
	ctx := context.Background()
	b := pubsub.NewBroker()
	topic, err := pubsub.NewTopic(b, "payments", codec.String(), codec.String())
	if err != nil {
		panic(err)
	}
	for i := range 5 {
		for _, c := range customers {
			if _, err := topic.Publish(ctx, c, fmt.Sprintf("%s-%d", c, i+1)); err != nil {
				panic(err)
			}
		}
	}
	p := &payments{paid: map[string][]string{}, fail: fail}
	start := time.Now()
	_, err = topic.Subscribe("payments", "worker-1", pubsub.HandlerFunc[string](p.pay),
		pubsub.WithKeyConcurrency(n),
		pubsub.WithGroupRetry(pubsub.RetryPolicy{BaseDelay: 300 * time.Millisecond}))
	if err != nil {
		panic(err)
	}
	if err := b.Drain(ctx); err != nil {
		panic(err)
	}
	took := time.Since(start)
	if err := b.Close(ctx); err != nil {
		panic(err)
	}
	return p, took
}

func main() {
	// One at a time, as without the option: 40 calls of 10ms each, one
	// after the other.
	one, slow := run(1, nil)
	fmt.Printf("one at a time: %d payments, at most %d at once, each customer's in order: %v\n",
		len(one.order), one.peak, one.inOrder())

	// Eight at a time: eight customers' calls wait on the service
	// together, never two of one customer.
	eight, fast := run(8, nil)
	fmt.Printf("8 at a time:   %d payments, at most %d at once, each customer's in order: %v\n",
		len(eight.order), eight.peak, eight.inOrder())
	fmt.Printf("8 at a time was at least 4x faster: %v\n", fast*4 <= slow)

	// carol's first payment fails, and waits 300ms for its retry: only
	// her payments wait with it.
	var once sync.Once
	failed, _ := run(8, func(msg pubsub.Message[string]) bool {
		first := false
		if msg.Value == "carol-1" {
			once.Do(func() { first = true })
		}
		return first
	})
	retry := slices.Index(failed.order, "carol-1")
	others := 0
	for _, v := range failed.order[:retry] {
		if !strings.HasPrefix(v, "carol-") {
			others++
		}
	}
	fmt.Printf("while carol-1 waited for its retry, the other customers' payments went through: %d of 35\n", others)
	fmt.Printf("carol's payments, in order: %s\n", strings.Join(failed.paid["carol"], " "))
	fmt.Printf("each customer's in order: %v\n", failed.inOrder())
}
