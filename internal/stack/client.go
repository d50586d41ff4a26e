package stack

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"
)

// Client calls the sample services' HTTP APIs.
type Client struct {
	HTTP *http.Client
}

// NewClient returns a client with a connection pool fit for load.
func NewClient() *Client {
	return &Client{HTTP: &http.Client{
		Timeout:   30 * time.Second,
		Transport: &http.Transport{MaxIdleConnsPerHost: 256, MaxConnsPerHost: 256},
	}}
}

// Order is the orders API's order.
type Order struct {
	ID         string `json:"id"`
	CustomerID string `json:"customer_id"`
	Amount     int64  `json:"amount"`
	Currency   string `json:"currency"`
	Status     string `json:"status"`
	Version    int    `json:"version"`
	// Settled says settlement recorded the paid order (SettlementRecorded
	// came back to orders).
	Settled bool `json:"settled"`
}

// Settlement is the settlement API's answer.
type Settlement struct {
	OrderID string `json:"order_id"`
	// Status is pending (the order was placed), settled (paid: the entries
	// are booked) or voided (cancelled).
	Status   string `json:"status"`
	Currency string `json:"currency"`
	Entries  []struct {
		Kind   string `json:"kind"`
		Amount int64  `json:"amount"`
	} `json:"entries"`
	Total int64 `json:"total"`
}

// StatusError is a response with an unexpected status.
type StatusError struct {
	Status int
	Body   string
}

func (e *StatusError) Error() string { return fmt.Sprintf("HTTP %d: %s", e.Status, e.Body) }

// Do sends a JSON request and decodes a 2xx JSON answer into out. It returns
// the status; a non-2xx status is a *StatusError.
func (c *Client) Do(ctx context.Context, method, url string, headers map[string]string, body, out any) (int, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return 0, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, err
	}
	if resp.StatusCode/100 != 2 {
		return resp.StatusCode, &StatusError{Status: resp.StatusCode, Body: string(b)}
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return resp.StatusCode, fmt.Errorf("decode %s: %w", b, err)
		}
	}
	return resp.StatusCode, nil
}

// PlaceOrder places an order; idemKey may be empty.
func (c *Client) PlaceOrder(ctx context.Context, base, customer string, amount int64, currency, idemKey string) (Order, int, error) {
	var o Order
	h := map[string]string{}
	if idemKey != "" {
		h["Idempotency-Key"] = idemKey
	}
	status, err := c.Do(ctx, http.MethodPost, base+"/orders", h,
		map[string]any{"customer_id": customer, "amount": amount, "currency": currency}, &o)
	return o, status, err
}

// Pay pays an order.
func (c *Client) Pay(ctx context.Context, base, id string, amount int64) (Order, error) {
	var o Order
	_, err := c.Do(ctx, http.MethodPost, base+"/orders/"+id+"/pay", nil, map[string]any{"amount": amount}, &o)
	return o, err
}

// Cancel cancels an order.
func (c *Client) Cancel(ctx context.Context, base, id string) (Order, error) {
	var o Order
	_, err := c.Do(ctx, http.MethodPost, base+"/orders/"+id+"/cancel", nil, nil, &o)
	return o, err
}

// Order fetches an order; a 404 is a *StatusError.
func (c *Client) Order(ctx context.Context, base, id string) (Order, error) {
	var o Order
	_, err := c.Do(ctx, http.MethodGet, base+"/orders/"+id, nil, nil, &o)
	return o, err
}

// Settlement fetches an order's settlement; a 404 is a *StatusError.
func (c *Client) Settlement(ctx context.Context, base, orderID string) (Settlement, error) {
	var s Settlement
	_, err := c.Do(ctx, http.MethodGet, base+"/settlements/"+orderID, nil, nil, &s)
	return s, err
}
