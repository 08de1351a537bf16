// The UI's JSON API (/ui/api/...), with the admin key kept for this tab in sessionStorage.
// Paths are relative to the page (/ui/), so the UI also works behind a proxy under a prefix.

const KEY = "areal-proxy.admin-key";

export class ApiError extends Error {
  constructor(status, message, detail) {
    super(message);
    this.status = status;
    this.detail = detail;
  }
}

export function storedKey() {
  return sessionStorage.getItem(KEY);
}

export function storeKey(key) {
  sessionStorage.setItem(KEY, key);
}

export function forgetKey() {
  sessionStorage.removeItem(KEY);
}

function headers(key) {
  return key ? { Authorization: `Bearer ${key}` } : {};
}

export async function get(path, params = {}) {
  const url = new URL(path, document.baseURI);
  for (const [name, value] of Object.entries(params)) {
    if (value !== null && value !== undefined && value !== "") url.searchParams.set(name, value);
  }
  const response = await fetch(url, { headers: headers(storedKey()) });
  const body = await response.json().catch(() => null);
  if (!response.ok) {
    const error = body && body.error ? body.error : {};
    throw new ApiError(response.status, error.message || response.statusText, error);
  }
  return body;
}

// Whether the data needs a key, and whether `key` is it: answered without one, so asking never
// produces a refused request.
export async function checkKey(key) {
  const response = await fetch(new URL("api/auth", document.baseURI), { headers: headers(key) });
  return response.json();
}

export function path(...parts) {
  return parts.map((p, i) => (i === 0 ? p : encodeURIComponent(p))).join("/");
}
