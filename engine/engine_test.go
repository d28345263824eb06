package engine

import (
	"fmt"
	"math/bits"
	"slices"
	"strings"
	"testing"
)

func TestRuns(t *testing.T) {
	for _, tc := range []struct {
		name       string
		partitions []int
		want       [][2]int
	}{
		{"empty", nil, nil},
		{"one", []int{3}, [][2]int{{0, 1}}},
		{"one run", []int{2, 2, 2}, [][2]int{{0, 3}}},
		{"alternating", []int{0, 1, 0}, [][2]int{{0, 1}, {1, 2}, {2, 3}}},
		{"runs", []int{1, 1, 0, 0, 0, 1}, [][2]int{{0, 2}, {2, 5}, {5, 6}}},
	} {
		var got [][2]int
		for start, end := range Runs(tc.partitions) {
			got = append(got, [2]int{start, end})
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: Runs(%v) = %v, want %v", tc.name, tc.partitions, got, tc.want)
		}
	}
	for start := range Runs([]int{0, 1, 2}) { // stopping early stops
		if start > 0 {
			t.Fatal("Runs went on after the loop broke")
		}
		break
	}
}

// Every capability has a name of its own, and String spells a set with
// them: a bit added without a name fails here, not in a skip message.
func TestEveryCapabilityHasAName(t *testing.T) {
	seen := map[string]Capabilities{}
	for bit := Capabilities(1); bit != 0 && bit <= AllCapabilities; bit <<= 1 {
		name := bit.String()
		if name == "" || strings.HasPrefix(name, "0x") || strings.Contains(name, "|") {
			t.Errorf("capability %#x: String() = %q, want a name of its own", uint32(bit), name)
		}
		if other, dup := seen[name]; dup {
			t.Errorf("capabilities %#x and %#x share the name %q", uint32(other), uint32(bit), name)
		}
		seen[name] = bit
	}
	if AllCapabilities != endCapabilities-1 {
		t.Errorf("AllCapabilities is %v, want every bit up to the last, %v", AllCapabilities, endCapabilities-1)
	}
	if len(capabilityNames) != bits.OnesCount32(uint32(AllCapabilities)) {
		t.Errorf("%d names for %d capabilities", len(capabilityNames), bits.OnesCount32(uint32(AllCapabilities)))
	}
	for c, want := range map[Capabilities]string{
		0:                                 "0",
		VirtualTime | InjectedClock:       "InjectedClock|VirtualTime",
		DiscardDeadLetters:                "DiscardDeadLetters",
		AllCapabilities + 1 | VirtualTime: fmt.Sprintf("VirtualTime|%#x", uint32(AllCapabilities+1)),
	} {
		if got := c.String(); got != want {
			t.Errorf("Capabilities(%#x).String() = %q, want %q", uint32(c), got, want)
		}
	}
}
