package jetstream_test

import (
	"context"
	"testing"
	"time"

	"github.com/logbus/logbus/pubsub"
	"github.com/logbus/logbus/pubsub/pubsubtest"
)

// joinBatch starts a member that subscribes to the group with a batch
// handler; each message of a batch is noted in the cluster's History as a
// delivery of its own, in the order of the batch.
func (c *cluster) joinBatch(name string, size int) *member {
	c.t.Helper()
	m := c.connect(name)
	each := pubsubtest.Observe(c.hist, membersTopic, membersGroup, name, work)
	g, err := m.topic.SubscribeBatch(membersGroup, name, pubsub.BatchHandlerFunc[string](func(ctx context.Context, msgs []pubsub.Message[string]) error {
		for i, msg := range msgs {
			if err := each.Handle(ctx, msg); err != nil {
				return &pubsub.BatchError{Index: i, Err: err}
			}
		}
		return nil
	}), pubsub.WithBatchSize(size))
	if err != nil {
		c.t.Fatal(err)
	}
	m.group = g
	return m
}

// Batch consumers in three brokers, joining and leaving while records
// flow: each partition is read by one member at a time, in order, and a
// clean join or leave redelivers nothing (the server's pin fences batch
// pulls as it does single ones).
func TestBatchMembersJoinAndLeaveCleanly(t *testing.T) {
	c := newCluster(t)
	pub := c.connect("publisher")
	a := c.joinBatch("a", 16)
	c.waitBalanced(a)

	const n = 300
	flow := func(round int) <-chan struct{} {
		done := make(chan struct{})
		go func() {
			defer close(done)
			c.publish(pub, round*n, n)
		}()
		return done
	}
	published := flow(0)
	b := c.joinBatch("b", 16)
	c.waitBalanced(a, b)
	<-published

	published = flow(1)
	m3 := c.joinBatch("c", 16)
	c.waitBalanced(a, b, m3)
	<-published

	published = flow(2)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.group.Leave(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	c.waitBalanced(a, m3)
	<-published

	drain(t, a)
	rep := c.check()
	if rep.Published != 3*n {
		t.Errorf("published %d, want %d", rep.Published, 3*n)
	}
	if r := rep.Redelivered(); r != 0 {
		t.Errorf("%d redeliveries (%v); a clean join or leave redelivers nothing", r, rep.Redeliveries)
	}
	t.Logf("%d deliveries of %d records, by member %v", rep.Deliveries, rep.Published, c.deliveriesBy())
}
