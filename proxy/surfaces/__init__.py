"""The API surfaces: adapters that read a request into stored records and render the
window and the reply back in their API's shape."""
