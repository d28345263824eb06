// Command orders is the logbus tour: run it with
//
//	go run ./examples/orders
//
// It publishes six order events to a topic "orders" with two partitions,
// keyed by customer, and consumes them with three consumer groups:
//
//   - billing acks everything;
//   - audit acks everything too, on a cursor of its own;
//   - shipping fails alice:paid once (a transient error, so it is retried and
//     acked on attempt 2) and always fails bob:cancelled (so it is
//     dead-lettered after 3 attempts).
//
// Along the way it shows the guarantees logbus gives: a key always lands on
// the same partition, every group sees every record, records of one key reach
// a group in publish order, failures are retried with backoff and then
// dead-lettered without blocking the partition for good, a group can replay
// what it already read, Close drains before it stops, and Close returns at its
// deadline even when a handler ignores its context. Last, it publishes
// asynchronously (PublishAsync, Flush) into a partition an offline group
// keeps full.
//
// The output is the same on every run: handlers only record what they see,
// and everything is printed from main after Broker.Drain, sorted wherever the
// order across partitions is not guaranteed.
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"strings"
	"sync"
	"time"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/pubsub"
)

// Order is the value of every record: a small struct, stored as JSON.
type Order struct {
	ID       string `json:"id"`
	Customer string `json:"customer"`
	Status   string `json:"status"`
}

// String is how the demo names an event: "alice:paid".
func (o Order) String() string { return o.Customer + ":" + o.Status }

// events are published in this order. The key of each record is the
// customer, so all of one customer's events share a partition.
var events = []Order{
	{ID: "A-1", Customer: "alice", Status: "created"},
	{ID: "B-1", Customer: "bob", Status: "created"},
	{ID: "A-1", Customer: "alice", Status: "paid"},
	{ID: "B-1", Customer: "bob", Status: "cancelled"},
	{ID: "A-1", Customer: "alice", Status: "shipped"},
	{ID: "C-1", Customer: "carol", Status: "created"},
}

// shippingRetry is short so that the demo finishes at once: 3 attempts,
// waiting 1ms then 2ms between them.
var shippingRetry = pubsub.RetryPolicy{MaxAttempts: 3, BaseDelay: time.Millisecond, MaxDelay: 10 * time.Millisecond}

func main() {
	log.SetFlags(0)
	ctx := context.Background()

	b := pubsub.NewBroker()
	orders, err := pubsub.NewTopic(b, "orders", codec.String(), codec.JSON[Order](), pubsub.WithPartitions(2))
	check(err)
	fmt.Println("logbus orders demo: one topic, three consumer groups")

	// Subscribe before publishing. (A group subscribed later would still
	// read the retained backlog: records are not freed when acked.)
	billingLog, auditLog, shippingLog := newRecorder(), newRecorder(), newRecorder()
	billing, err := orders.Subscribe("billing", "billing-1", billingLog.ackAll())
	check(err)
	audit, err := orders.Subscribe("audit", "audit-1", auditLog.ackAll())
	check(err)
	shipping, err := orders.Subscribe("shipping", "shipping-1", shippingHandler(shippingLog),
		pubsub.WithGroupRetry(shippingRetry))
	check(err)

	publishAll(ctx, orders)

	// Drain is the barrier: it returns once every group has committed every
	// record published so far (acked or dead-lettered). No sleeping.
	check(b.Drain(ctx))

	section("every group sees every record")
	fmt.Printf("billing received %d records\n", billingLog.count())
	fmt.Printf("audit received %d records (own cursor: %s)\n", auditLog.count(), cursors(audit, orders.Partitions()))
	fmt.Printf("alice's events reached billing in order: %s\n", strings.Join(billingLog.statuses("alice"), " -> "))
	fmt.Println("  alice's events stay in order: one key -> one partition -> one worker")

	section("shipping: retries and dead letters")
	fmt.Printf("shipping stats: %+v\n", shipping.Stats())
	fmt.Println("  Delivered counts acks (6 records - 1 dead letter); Retried counts failed")
	fmt.Println("  attempts that were retried (1 for alice:paid + 2 for bob:cancelled)")
	fmt.Printf("alice:paid was attempted %d times: failed once (transient), acked on attempt 2\n",
		shippingLog.attempts("alice:paid"))
	fmt.Printf("shipping acked on partition 1: %s\n", strings.Join(shippingLog.partition(1), ", "))
	fmt.Println("  while alice:paid waited for its retry, the records behind it waited too:")
	fmt.Println("  retries never reorder a partition")
	printDeadLetters(shipping)
	fmt.Printf("shipping's cursor: %s\n", cursors(shipping, orders.Partitions()))
	fmt.Println("  a dead letter is committed like an ack: partition 0 is not stuck on bob:cancelled")

	section("replay")
	printLag(b, orders.Name(), "billing", "audit", "shipping")
	fmt.Println("  every group has committed everything; now billing rewinds to offset 0")
	check(billing.Replay(context.Background(), pubsub.AtOffset(0)))
	check(b.Drain(ctx))
	fmt.Printf("billing after replay: %d records received (6 + 6 replayed from offset 0)\n", billingLog.count())
	fmt.Printf("alice's events in billing now: %s\n", strings.Join(billingLog.statuses("alice"), " -> "))
	fmt.Printf("audit after billing's replay: %d records received (its cursor did not move)\n", auditLog.count())

	section("shutdown")
	shutdown(b, orders, shipping)

	section("publishing asynchronously")
	publishAsync()

	section("a shutdown whose deadline passes")
	shutdownPastDeadline()
}

// publishAll publishes the events in order and prints where each landed.
func publishAll(ctx context.Context, orders *pubsub.Topic[string, Order]) {
	section(fmt.Sprintf("publish to %q: %d partitions, key = customer", orders.Name(), orders.Partitions()))
	for _, o := range events {
		pos, err := orders.Publish(ctx, o.Customer, o)
		check(err)
		fmt.Printf("%-14s -> partition %d, offset %d\n", o, pos.Partition, pos.Offset)
	}
	fmt.Println("  a key always lands on the same partition (CRC-32 of the key)")
	fmt.Println("  offsets count up per partition, like a Kafka log")
}

// shippingHandler acks everything except two orders: alice:paid fails once,
// as a busy warehouse would, and bob:cancelled always fails. Returning an
// error nacks the message; logbus retries it with backoff, then gives up and
// dead-letters it. (Wrapping pubsub.ErrPermanent would skip the retries.)
func shippingHandler(r *recorder) pubsub.HandlerFunc[Order] {
	return func(_ context.Context, msg pubsub.Message[Order]) error {
		r.attempt(msg)
		switch msg.Value.String() {
		case "alice:paid":
			if msg.Attempt == 1 {
				return errors.New("warehouse busy, try again")
			}
		case "bob:cancelled":
			return fmt.Errorf("order %s was cancelled: nothing to ship", msg.Value.ID)
		}
		r.ack(msg)
		return nil
	}
}

// printDeadLetters prints what the group gave up on.
func printDeadLetters(g *pubsub.Group[Order]) {
	for _, dl := range g.DeadLetters() {
		fmt.Printf("dead letter: %s (partition %d, offset %d) after %d attempts: %v\n",
			dl.Message.Value, dl.Message.Partition, dl.Message.Offset, dl.Attempts, dl.Err)
	}
}

// printLag prints how many records of topic each group has yet to commit.
func printLag(b *pubsub.Broker, topic string, groups ...string) {
	var parts []string
	for _, g := range groups {
		lag, err := b.Lag(g, topic)
		check(err)
		parts = append(parts, fmt.Sprintf("%s=%d", g, lag))
	}
	fmt.Printf("lag before replay: %s\n", strings.Join(parts, " "))
}

// shutdown closes the broker gracefully and shows what is left.
func shutdown(b *pubsub.Broker, orders *pubsub.Topic[string, Order], shipping *pubsub.Group[Order]) {
	// Close drains first, bounded by ctx; nil means every group committed
	// everything.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	check(b.Close(ctx))
	fmt.Printf("Close returned nil: every group committed everything; state=%s\n", b.State())

	_, err := orders.Publish(ctx, "dave", Order{ID: "D-1", Customer: "dave", Status: "created"})
	if !errors.Is(err, pubsub.ErrClosed) {
		log.Fatalf("publish after Close: got %v, want ErrClosed", err)
	}
	fmt.Println("publish after Close: refused with ErrClosed")
	fmt.Printf("dead letters kept by shipping: %d\n", len(shipping.DeadLetters()))
}

// publishAsync publishes receipts with PublishAsync, which does not wait
// for the engine to confirm each one, and checks them all at once with
// Flush. The printer group is paused, as if the printer were offline, so
// the partition (3 records, Block) fills up and the last two receipts fail
// with ErrBackpressure after its 20ms BlockTimeout.
func publishAsync() {
	ctx := context.Background()
	b := pubsub.NewBroker()
	defer b.Close(ctx)
	receipts, err := pubsub.NewTopic(b, "receipts", codec.String(), codec.String(),
		pubsub.WithRetention(pubsub.Retention{MaxMessages: 3, BlockTimeout: 20 * time.Millisecond}))
	check(err)
	printed := &counter{}
	printer, err := receipts.Subscribe("printer", "printer-1", pubsub.HandlerFunc[string](
		func(context.Context, pubsub.Message[string]) error { printed.add(); return nil }))
	check(err)
	check(printer.Pause(ctx)) // the printer is offline: nothing it holds is freed

	var pending []*pubsub.Pending
	for i := 1; i <= 5; i++ {
		pending = append(pending, receipts.PublishValueAsync(ctx, fmt.Sprintf("receipt %d", i)))
	}
	err = receipts.Flush(ctx) // waits for every receipt published before it
	fmt.Printf("Flush: %v\n", err)
	fmt.Printf("  errors.Is(err, pubsub.ErrBackpressure) = %v\n", errors.Is(err, pubsub.ErrBackpressure))
	for i, p := range pending {
		pos, err := p.Wait(ctx) // resolved already: Flush waited for it
		switch {
		case err == nil:
			fmt.Printf("receipt %d -> offset %d\n", i+1, pos.Offset)
		case errors.Is(err, pubsub.ErrBackpressure):
			fmt.Printf("receipt %d -> not stored: ErrBackpressure\n", i+1)
		default:
			log.Fatalf("receipt %d: %v", i+1, err)
		}
	}
	fmt.Printf("Flush again: %v (each failure is reported once)\n", receipts.Flush(ctx))
	fmt.Println("  records of a partition are stored in call order; on an engine with")
	fmt.Println("  records in flight (JetStream) the ones behind a failure fail too, with ErrAborted")

	check(printer.Resume(ctx))
	for i := 4; i <= 5; i++ {
		receipts.PublishValueAsync(ctx, fmt.Sprintf("receipt %d", i)) // published again
	}
	check(receipts.Flush(ctx))
	check(b.Drain(ctx)) // waits for records in flight too, then for the groups
	fmt.Printf("the printer, back online, printed %d receipts\n", printed.load())
}

// counter counts deliveries, from any partition's handler.
type counter struct {
	mu sync.Mutex
	n  int
}

func (c *counter) add() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n++
}

func (c *counter) load() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

// shutdownPastDeadline shows what Close does with a handler that ignores
// its context: it returns at its deadline all the same, names what was
// left, and the handler, finishing later, commits nothing.
func shutdownPastDeadline() {
	b := pubsub.NewBroker()
	emails, err := pubsub.NewTopic(b, "emails", codec.String(), codec.String())
	check(err)
	release, returned := make(chan struct{}), make(chan struct{})
	mailer, err := emails.Subscribe("mailer", "mailer-1", pubsub.HandlerFunc[string](
		func(ctx context.Context, _ pubsub.Message[string]) error {
			defer close(returned)
			<-release // ignores ctx: a handler should select on ctx.Done() too
			return nil
		}))
	check(err)
	for _, v := range []string{"welcome alice", "welcome bob"} {
		_, err := emails.PublishValue(context.Background(), v)
		check(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	err = b.Close(ctx)
	fmt.Printf("Close with a 50ms deadline returned by it: %v\n", time.Since(start) < time.Second)
	se, ok := errors.AsType[*pubsub.ShutdownError](err)
	if !ok {
		log.Fatalf("Close: got %v, want a *pubsub.ShutdownError", err)
	}
	fmt.Printf("  errors.Is(err, context.DeadlineExceeded) = %v\n", errors.Is(err, context.DeadlineExceeded))
	for _, u := range se.Unfinished {
		fmt.Printf("left behind: group %s partition %d committed %d end %d, handler still running: %v\n",
			u.Group, u.Partition, u.Committed, u.End, u.Running)
	}
	close(release) // the stuck handler returns nil, after Close
	<-returned
	fmt.Printf("after the stuck handler acked, mailer's offset is still %d: nothing commits after Close\n", mailer.Committed(0))
}

// cursors formats the group's committed offset on each partition: the offset
// of the next record it will read.
func cursors(g *pubsub.Group[Order], partitions int) string {
	var parts []string
	for p := range partitions {
		parts = append(parts, fmt.Sprintf("partition %d at offset %d", p, g.Committed(p)))
	}
	return strings.Join(parts, ", ")
}

// recorder collects what a group's handlers saw. Handlers of different
// partitions run concurrently, so it locks; main prints from it only after
// Drain, so the output never depends on scheduling.
type recorder struct {
	mu    sync.Mutex
	acked []acked        // in the order they were acked
	tries map[string]int // event -> highest attempt seen
}

// acked is one acked message: the order and where it came from.
type acked struct {
	order     Order
	partition int
	offset    int64
}

func newRecorder() *recorder { return &recorder{tries: make(map[string]int)} }

// ackAll returns a handler that records every message and acks it.
func (r *recorder) ackAll() pubsub.HandlerFunc[Order] {
	return func(_ context.Context, msg pubsub.Message[Order]) error {
		r.attempt(msg)
		r.ack(msg)
		return nil
	}
}

func (r *recorder) attempt(msg pubsub.Message[Order]) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.tries[msg.Value.String()] = max(r.tries[msg.Value.String()], msg.Attempt)
}

func (r *recorder) ack(msg pubsub.Message[Order]) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.acked = append(r.acked, acked{order: msg.Value, partition: msg.Partition, offset: msg.Offset})
}

func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.acked)
}

func (r *recorder) attempts(event string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.tries[event]
}

// statuses returns the statuses of one customer's orders in the order they
// were acked. Across customers on different partitions that order is up to
// the scheduler; within one customer it is the publish order.
func (r *recorder) statuses(customer string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, a := range r.acked {
		if a.order.Customer == customer {
			out = append(out, a.order.Status)
		}
	}
	return out
}

// partition returns the events acked from one partition, in the order they
// were acked.
func (r *recorder) partition(p int) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, a := range r.acked {
		if a.partition == p {
			out = append(out, fmt.Sprintf("%s@%d", a.order, a.offset))
		}
	}
	return out
}

func section(title string) { fmt.Printf("\n== %s ==\n", title) }

func check(err error) {
	if err != nil {
		log.Fatal(err)
	}
}
