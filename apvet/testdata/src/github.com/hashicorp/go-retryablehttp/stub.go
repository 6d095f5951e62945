// Package retryablehttp is a stub of go-retryablehttp's API, for apvet's
// tests.
package retryablehttp

import "net/http"

type Client struct{}

func NewClient() *Client                                  { return &Client{} }
func (c *Client) Do(req *Request) (*http.Response, error) { return nil, nil }

type Request struct{}

func NewRequest(method, url string, body any) (*Request, error) { return &Request{}, nil }
