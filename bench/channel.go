package main

import (
	"sync"
)

// chanPeer is the baseline: buffered Go channels (1024), no library at all.
//
// Mapping: one channel per (group, partition), read by one goroutine.
//   - S1: one channel.
//   - S2: the producer sends each message to the 4 groups' channels in turn.
//     It sends the same slice to all four rather than a copy per channel:
//     the consumers only read it, and a copy per consumer would charge the
//     baseline with work that plain channels do not need. logbus's bytes
//     codec does copy per group (its Decode must not alias the stored
//     record), so this makes the baseline a lower bound, not a like-for-like.
//   - S3: producer p sends to channel p, read by consumer p.
//
// There is no ack: a message received is a message done.
//
// chan-batch (batch > 1) sends slices of up to batch messages instead, the
// channel's own way of batching, with channels of 1024/batch slots so that
// as many messages can be in flight.
type chanPeer struct{ batch int }

func (p chanPeer) name() string {
	if p.batch > 1 {
		return "chan-batch"
	}
	return "chan"
}

func (p chanPeer) run(sc scenario, n int) (result, error) {
	if p.batch > 1 {
		return runChannels(sc, n, p.batch, 1024/p.batch,
			func(first uint64, count int, stamp bool) [][]byte {
				batch := make([][]byte, count)
				for i := range batch {
					batch[i] = newPayload(first+uint64(i), stamp)
				}
				return batch
			},
			func(tr *tracker, g int, batch [][]byte) {
				for _, m := range batch {
					tr.deliver(g, m)
				}
			})
	}
	return runChannels(sc, n, 1, 1024,
		func(first uint64, _ int, stamp bool) []byte { return newPayload(first, stamp) },
		func(tr *tracker, g int, m []byte) { tr.deliver(g, m) })
}

// runChannels is one run over channels of M with buffer slots, one per
// (group, partition), each read by its own goroutine. A producer has build
// make the messages [first, first+count) of its share (at most batch at a
// time) into one M and sends it to every group's channel of its partition;
// deliver gives what a consumer received to the tracker. build makes fresh
// slices: the consumers hold on to them, so a producer cannot reuse a
// buffer.
func runChannels[M any](sc scenario, n, batch, buffer int,
	build func(first uint64, count int, stamp bool) M,
	deliver func(tr *tracker, g int, m M),
) (result, error) {
	stamp := sc.pace > 0
	tr := newTracker(n, sc.groups, stamp)
	chans := make([][]chan M, sc.groups) // [group][partition]
	var consumers sync.WaitGroup
	for g := range sc.groups {
		chans[g] = make([]chan M, sc.partitions)
		for part := range sc.partitions {
			ch := make(chan M, buffer)
			chans[g][part] = ch
			// Ends when the channel is closed after the producers finish.
			consumers.Go(func() {
				for m := range ch {
					deliver(tr, g, m)
				}
			})
		}
	}

	var res result
	m := startMeter()
	err := runProducerBatches(sc, n, batch, func(p int, first uint64, count int) error {
		msg := build(first, count, stamp)
		part := p % sc.partitions
		for g := range sc.groups {
			chans[g][part] <- msg
		}
		return nil
	})
	if err == nil {
		err = tr.wait(*flagTimeout)
	}
	m.stop(&res)

	for g := range chans {
		for _, ch := range chans[g] {
			close(ch)
		}
	}
	consumers.Wait()
	tr.finish(&res)
	return res, err
}
