package enum

import "testing"

type color int8

const (
	red color = iota
	green
	blue
)

var colorNames = []string{red: "red", blue: "blue"}

func TestName(t *testing.T) {
	for _, tc := range []struct {
		v    color
		want string
	}{
		{red, "red"},
		{blue, "blue"},
		{green, "color(1)"}, // no name in the table
		{-1, "color(-1)"},
		{3, "color(3)"},
	} {
		if got := Name(colorNames, "color", tc.v); got != tc.want {
			t.Errorf("Name(%d) = %q, want %q", tc.v, got, tc.want)
		}
	}
}
