export default function Failure({ what, message }: { what: string; message: string }) {
  return <div className="error" data-testid="error"><strong>{what} failed:</strong> {message}</div>;
}
