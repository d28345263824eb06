package codec_test

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"

	"github.com/logbus/logbus/codec"
)

type Order struct {
	ID   int    `json:"id"`
	Item string `json:"item"`
}

func ExampleJSON() {
	c := codec.JSON[Order]()

	b, err := c.Encode(Order{ID: 42, Item: "tea"})
	if err != nil {
		panic(err)
	}
	fmt.Println(string(b))

	o, err := c.Decode(b)
	if err != nil {
		panic(err)
	}
	fmt.Printf("%+v\n", o)

	_, err = c.Decode([]byte(`{"id":"forty-two"}`))
	fmt.Println(errors.Is(err, codec.ErrDecode))
	// Output:
	// {"id":42,"item":"tea"}
	// {ID:42 Item:tea}
	// true
}

func ExampleInt() {
	b, _ := codec.Int[int16]().Encode(-2)
	fmt.Printf("% x\n", b)

	b, _ = codec.Int[uint32]().Encode(258)
	fmt.Printf("% x\n", b)

	n, _ := codec.Int[uint32]().Decode(b)
	fmt.Println(n)

	_, err := codec.Int[uint32]().Decode([]byte{1, 2})
	fmt.Println(err)
	fmt.Println(errors.Is(err, codec.ErrDecode))
	// Output:
	// ff fe
	// 00 00 01 02
	// 258
	// codec: cannot decode: uint32: want 4 bytes, got 2
	// true
}

func ExampleBytes() {
	c := codec.Bytes()
	buf := []byte("hello")

	stored, _ := c.Encode(buf)
	buf[0] = 'J' // reusing the buffer does not touch the stored record

	v, _ := c.Decode(stored)
	v[0] = 'C' // nor does mutating a decoded value
	fmt.Println(string(buf), string(v), string(stored))
	// Output:
	// Jello Cello hello
}

func ExampleRawBytes() {
	c := codec.RawBytes()
	stored, _ := c.Encode([]byte("hello"))

	// The stored bytes themselves, no copy: read them during the call that
	// delivers them, and clone them to keep them.
	v, _ := c.Decode(stored)
	kept := bytes.Clone(v)
	fmt.Println(string(v), &v[0] == &stored[0], string(kept))
	// Output:
	// hello true hello
}

// Celsius is stored as decimal text, using Func to adapt strconv.
type Celsius float64

func ExampleFunc() {
	c := codec.Func(
		func(t Celsius) ([]byte, error) {
			return strconv.AppendFloat(nil, float64(t), 'f', -1, 64), nil
		},
		func(b []byte) (Celsius, error) {
			f, err := strconv.ParseFloat(string(b), 64)
			return Celsius(f), err
		},
	)

	b, _ := c.Encode(21.5)
	fmt.Println(string(b))

	_, err := c.Decode([]byte("warm"))
	fmt.Println(err)
	// Output:
	// 21.5
	// codec: cannot decode: strconv.ParseFloat: parsing "warm": invalid syntax
}
