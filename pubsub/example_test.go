package pubsub_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/pubsub"
)

func ExampleNewTopic() {
	b := pubsub.NewBroker()
	defer b.Close(context.Background())

	orders, err := pubsub.NewTopic(b, "orders", codec.String(), codec.String(), pubsub.WithPartitions(2))
	if err != nil {
		panic(err)
	}
	for _, event := range []string{"created", "paid", "shipped"} {
		pos, _ := orders.Publish(context.Background(), "alice", "alice:"+event)
		fmt.Printf("alice:%s -> partition %d offset %d\n", event, pos.Partition, pos.Offset)
	}
	// Output:
	// alice:created -> partition 1 offset 0
	// alice:paid -> partition 1 offset 1
	// alice:shipped -> partition 1 offset 2
}

func ExampleTopic_Subscribe() {
	ctx := context.Background()
	b := pubsub.NewBroker()
	orders, _ := pubsub.NewTopic(b, "orders", codec.String(), codec.String())

	_, err := orders.Subscribe("billing", "billing-1", pubsub.HandlerFunc[string](
		func(ctx context.Context, msg pubsub.Message[string]) error {
			fmt.Printf("billing got %s (offset %d, attempt %d)\n", msg.Value, msg.Offset, msg.Attempt)
			return nil // ack
		}))
	if err != nil {
		panic(err)
	}
	orders.Publish(ctx, "alice", "alice:created")
	orders.Publish(ctx, "alice", "alice:paid")
	b.Close(ctx) // drains first: both messages are handled before it returns
	// Output:
	// billing got alice:created (offset 0, attempt 1)
	// billing got alice:paid (offset 1, attempt 1)
}

// Every group sees every record, on its own cursor.
func ExampleTopic_Subscribe_twoGroups() {
	ctx := context.Background()
	b := pubsub.NewBroker()
	orders, _ := pubsub.NewTopic(b, "orders", codec.String(), codec.Int[int]())

	var mu sync.Mutex
	seen := map[string][]int{}
	record := func(group string) pubsub.HandlerFunc[int] {
		return func(_ context.Context, msg pubsub.Message[int]) error {
			mu.Lock()
			defer mu.Unlock()
			seen[group] = append(seen[group], msg.Value)
			return nil
		}
	}
	orders.Subscribe("billing", "billing-1", record("billing"))
	orders.Subscribe("audit", "audit-1", record("audit"))
	for i := range 3 {
		orders.Publish(ctx, "alice", 100+i)
	}
	b.Close(ctx)
	fmt.Println("billing:", seen["billing"])
	fmt.Println("audit:  ", seen["audit"])
	// Output:
	// billing: [100 101 102]
	// audit:   [100 101 102]
}

// A transient failure is retried; a record that keeps failing is
// dead-lettered and the partition moves on.
func ExampleGroup_DeadLetters() {
	ctx := context.Background()
	b := pubsub.NewBroker(pubsub.WithRetry(pubsub.RetryPolicy{MaxAttempts: 3, BaseDelay: time.Millisecond}))
	orders, _ := pubsub.NewTopic(b, "orders", codec.String(), codec.String())

	g, _ := orders.Subscribe("shipping", "shipping-1", pubsub.HandlerFunc[string](
		func(_ context.Context, msg pubsub.Message[string]) error {
			switch {
			case msg.Value == "bob:cancelled":
				return errors.New("cannot ship a cancelled order")
			case msg.Attempt == 1:
				return errors.New("warehouse busy") // transient
			}
			fmt.Printf("shipped %s on attempt %d\n", msg.Value, msg.Attempt)
			return nil
		}))
	orders.Publish(ctx, "alice", "alice:paid")
	orders.Publish(ctx, "bob", "bob:cancelled")
	orders.Publish(ctx, "carol", "carol:paid")
	b.Drain(ctx)

	for _, dl := range g.DeadLetters() {
		fmt.Printf("dead letter: %s after %d attempts: %v\n", dl.Message.Value, dl.Attempts, dl.Err)
	}
	fmt.Printf("%+v\n", g.Stats())
	b.Close(ctx)
	// Output:
	// shipped alice:paid on attempt 2
	// shipped carol:paid on attempt 2
	// dead letter: bob:cancelled after 3 attempts: cannot ship a cancelled order
	// {Delivered:2 Retried:4 DeadLettered:1 Skipped:0 DeadLettersEvicted:0 Redriven:0}
}

// A group can rewind and read again what it already read.
func ExampleGroup_Replay() {
	ctx := context.Background()
	b := pubsub.NewBroker()
	events, _ := pubsub.NewTopic(b, "events", codec.String(), codec.String())
	var mu sync.Mutex
	var got []string
	g, _ := events.Subscribe("audit", "audit-1", pubsub.HandlerFunc[string](
		func(_ context.Context, msg pubsub.Message[string]) error {
			mu.Lock()
			defer mu.Unlock()
			got = append(got, msg.Value)
			return nil
		}))
	for _, v := range []string{"a", "b", "c"} {
		events.PublishValue(ctx, v)
	}
	b.Drain(ctx)
	g.Replay(context.Background(), pubsub.AtOffset(1))
	b.Drain(ctx)
	b.Close(ctx)
	fmt.Println(got)
	// Output: [a b c b c]
}

// A full Block partition makes Publish wait for the group holding its
// oldest record, then fail with ErrBackpressure naming that group; nothing
// is appended. (A partition no group reads never blocks: it trims its
// oldest record instead.)
func ExampleRetention() {
	ctx := context.Background()
	b := pubsub.NewBroker()
	defer b.Close(ctx)
	jobs, _ := pubsub.NewTopic(b, "jobs", codec.String(), codec.String(),
		pubsub.WithRetention(pubsub.Retention{MaxMessages: 2, OnFull: pubsub.Block, BlockTimeout: time.Millisecond}))
	busy := make(chan struct{})
	defer close(busy) // before Close, which waits for the handler
	jobs.Subscribe("audit", "audit-1", pubsub.HandlerFunc[string](func(ctx context.Context, m pubsub.Message[string]) error {
		<-busy // a slow consumer: it holds j1 until the example ends
		return nil
	}))

	for _, j := range []string{"j1", "j2", "j3"} {
		_, err := jobs.PublishValue(ctx, j)
		fmt.Printf("%s: backpressure=%v\n", j, errors.Is(err, pubsub.ErrBackpressure))
		if err != nil {
			fmt.Println(err)
		}
	}
	fmt.Printf("%+v\n", jobs.Stats())
	// Output:
	// j1: backpressure=false
	// j2: backpressure=false
	// j3: backpressure=true
	// logbus: publish to topic "jobs": partition full: partition 0: group "audit" holds the oldest record, offset 0; full at 2 records (MaxMessages) for 1ms
	// {Published:2 Retained:2 RetainedBytes:4 Reclaimed:0 Dropped:0 Expired:0 Blocked:1 TimedOut:1}
}

// A Stream hands messages over on a channel; each must be acked or nacked.
func ExampleTopic_Stream() {
	ctx := context.Background()
	b := pubsub.NewBroker()
	tasks, _ := pubsub.NewTopic(b, "tasks", codec.String(), codec.String())
	s, _ := tasks.Stream("workers", "worker-1")
	for _, v := range []string{"wash", "dry", "fold"} {
		tasks.PublishValue(ctx, v)
	}
	var done []string
	for d := range s.C() {
		done = append(done, d.Value)
		d.Ack()
		if len(done) == 3 {
			break
		}
	}
	s.Close()
	b.Close(ctx)
	fmt.Println(slices.Clone(done))
	// Output: [wash dry fold]
}

// A batch lands where the same records published one by one would, for a
// fraction of the cost per record.
func ExampleTopic_PublishBatch() {
	ctx := context.Background()
	b := pubsub.NewBroker()
	defer b.Close(ctx)
	orders, _ := pubsub.NewTopic(b, "orders", codec.String(), codec.String(), pubsub.WithPartitions(2))

	positions, err := orders.PublishBatch(ctx, []pubsub.Entry[string, string]{
		{Key: "alice", Value: "alice:created"},
		{Key: "bob", Value: "bob:created"},
		{Key: "alice", Value: "alice:paid"},
	})
	if err != nil {
		panic(err)
	}
	for _, pos := range positions {
		fmt.Printf("partition %d offset %d\n", pos.Partition, pos.Offset)
	}
	// Output:
	// partition 1 offset 0
	// partition 0 offset 0
	// partition 1 offset 1
}
